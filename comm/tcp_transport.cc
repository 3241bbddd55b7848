// tcp_transport.cc: TcpTransport, one peer's byte streams over its TCP socket.
//
// Sends go straight from the caller's buffer into the kernel (send with
// MSG_DONTWAIT). Receives land in a 1 MiB staging buffer and are handed to the
// sink in 8-byte multiples (the < 8-byte tail waits for the next recv), so a
// reducing sink always sees whole elements. The staging buffer never reads past
// the current message: the next message's bytes stay in the kernel.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "comm/transport.h"

namespace ringtrain::comm {

namespace {

constexpr size_t kStagingBytes = 1 << 20;

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const Socket& socket) : fd_(socket.fd()), staging_(kStagingBytes) {}

  size_t try_send(const void* data, size_t nbytes) override {
    ssize_t n = ::send(fd_, data, nbytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    if (connection_gone(errno) || errno == EBADF) {
      throw SocketClosed(detail::concat("connection closed while sending (", std::strerror(errno), ")"));
    }
    SYS_CHECK(n);
    return 0;
  }

  size_t try_recv(size_t offset, size_t remaining, const RecvSink& sink) override {
    size_t want = std::min(staging_.size() - staged_, remaining - staged_);
    if (want > 0) {
      ssize_t n = ::recv(fd_, staging_.data() + staged_, want, MSG_DONTWAIT);
      if (n == 0) throw SocketClosed("connection closed while receiving");
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        if (connection_gone(errno) || errno == EBADF) {
          throw SocketClosed(detail::concat("connection lost while receiving (", std::strerror(errno), ")"));
        }
        SYS_CHECK(n);
      }
      staged_ += static_cast<size_t>(n);
    }
    // Hand over whole 8-byte groups, or everything when the message is complete.
    size_t ready = staged_ == remaining ? staged_ : staged_ & ~size_t{7};
    if (ready == 0) return 0;
    sink(staging_.data(), offset, ready);
    std::memmove(staging_.data(), staging_.data() + ready, staged_ - ready);
    staged_ -= ready;
    return ready;
  }

  int poll_fd() const override { return fd_; }
  const char* kind() const override { return "tcp"; }

 private:
  int fd_;                   // borrowed from the PeerMesh's Socket, which outlives us
  std::vector<char> staging_;
  size_t staged_ = 0;        // bytes in staging_ not yet handed to a sink
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(const Socket& socket) {
  return std::make_unique<TcpTransport>(socket);
}

}  // namespace ringtrain::comm
