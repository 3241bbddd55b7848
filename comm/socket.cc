#include "comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

namespace ringtrain::comm {

int millis_until(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

namespace {

// Resolves host (a name or dotted address) to an IPv4 sockaddr.
// The IPv4 address of `host`, or nullopt with the resolver's reason in *error.
std::optional<sockaddr_in> try_resolve(const std::string& host, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    *error = detail::concat("cannot resolve host '", host, "': ", gai_strerror(rc),
                            " (check MASTER_ADDR / the node list)");
    return std::nullopt;
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(result->ai_addr);
  freeaddrinfo(result);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

sockaddr_in resolve(const std::string& host, int port) {
  std::string error;
  std::optional<sockaddr_in> addr = try_resolve(host, port, &error);
  if (!addr) throw CommError(error);
  return *addr;
}

// Waits until fd is ready for `events` or the deadline passes. Returns revents (0 on timeout).
short wait_fd(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd pfd{fd, events, 0};
    int rc = ::poll(&pfd, 1, std::min(millis_until(deadline), 100));
    if (rc > 0) return pfd.revents;
    if (rc < 0 && errno != EINTR) SYS_CHECK(rc);
    if (Clock::now() >= deadline) return 0;
  }
}

}  // namespace

Socket::~Socket() { close(); }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Socket Socket::listen(const std::string& host, int port, const std::string& port_hint) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SYS_CHECK(fd);
  Socket sock(fd);
  int one = 1;
  SYS_CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = host.empty() || host == "0.0.0.0" ? htonl(INADDR_ANY)
                                                           : resolve(host, port).sin_addr.s_addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    if (err == EADDRINUSE) {
      throw CommError(detail::concat(
          "port ", port, " is already in use on ", local_hostname(),
          " (another job, or a previous run that has not exited yet); ",
          port_hint.empty() ? std::string("choose another port")
                            : "set " + port_hint + " to a free port",
          ", e.g. one printed by `python3 -c 'import socket; s=socket.socket(); s.bind((\"\",0)); "
          "print(s.getsockname()[1])'`"));
    }
    throw CommError(detail::concat("cannot bind ", host.empty() ? "*" : host, ":", port, ": ",
                                   std::strerror(err)));
  }
  SYS_CHECK(::listen(fd, 128));
  return sock;
}

Socket Socket::connect(const std::string& host, int port, Deadline deadline) {
  std::string last_error = "timed out";
  auto backoff = std::chrono::milliseconds(5);
  bool said_unresolved = false;
  while (true) {
    // Resolved on every attempt: the master's name may not exist yet when this rank
    // starts (a Kubernetes pod whose DNS record appears with it), as TCPStore allows.
    std::string resolve_error;
    std::optional<sockaddr_in> resolved = try_resolve(host, port, &resolve_error);
    if (!resolved) {
      if (!said_unresolved) {
        std::fprintf(stderr, "ringtrain: %s; retrying until the deadline (%d s)\n", resolve_error.c_str(),
                     std::max(0, millis_until(deadline) / 1000));
        said_unresolved = true;
      }
      if (Clock::now() + backoff >= deadline) throw CommTimeoutError(resolve_error);
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
      continue;
    }
    sockaddr_in addr = *resolved;
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    SYS_CHECK(fd);
    Socket sock(fd);
    // A blocking connect() to a host that drops SYNs (a firewall, a listener whose
    // backlog is full) waits for the kernel's SYN retries, about two minutes, whatever
    // the deadline says. So connect without blocking and wait for the answer in poll(),
    // at most until the deadline.
    const int flags = fcntl(fd, F_GETFL);
    SYS_CHECK(flags);
    SYS_CHECK(fcntl(fd, F_SETFL, flags | O_NONBLOCK));
    int err = 0;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int ready = 0;
        do {
          ready = ::poll(&p, 1, millis_until(deadline));
        } while (ready < 0 && errno == EINTR);
        SYS_CHECK(ready);
        if (ready == 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof(err);
          SYS_CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len));
        }
      }
    }
    if (err == 0) {
      SYS_CHECK(fcntl(fd, F_SETFL, flags));  // the rest of Socket expects blocking I/O
      int one = 1;
      SYS_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
      return sock;
    }
    last_error = std::strerror(err);
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  throw CommTimeoutError(detail::concat("cannot connect to ", host, ":", port, " (", last_error,
                                        "): is the master (rank 0) running and is the address "
                                        "reachable from ", local_hostname(), "?"));
}

Socket Socket::accept(Deadline deadline) const {
  if (wait_fd(fd_, POLLIN, deadline) == 0) {
    throw CommTimeoutError(detail::concat("timed out waiting for a connection on port ",
                                          local_port()));
  }
  int error = 0;
  std::optional<Socket> client = accept_queued(&error);
  if (!client) {
    errno = error;
    SYS_CHECK(-1);
  }
  return std::move(*client);
}

std::optional<Socket> Socket::accept_queued(int* error) const {
  int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    *error = errno;
    return std::nullopt;
  }
  Socket client(fd);
  int one = 1;
  SYS_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
  return client;
}

int Socket::local_port() const {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  SYS_CHECK(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len));
  return ntohs(addr.sin_port);
}

std::string Socket::local_address() const {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  SYS_CHECK(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len));
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return text;
}

void Socket::set_nonblocking(bool on) const {
  int flags = fcntl(fd_, F_GETFL, 0);
  SYS_CHECK(flags);
  SYS_CHECK(fcntl(fd_, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK)));
}

void Socket::set_buffer_sizes(int bytes) const {
  SYS_CHECK(setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)));
  SYS_CHECK(setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes)));
}

void Socket::send_all(const void* data, size_t nbytes, Deadline deadline) const {
  auto* bytes = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::send(fd_, bytes, nbytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes += n;
      nbytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (wait_fd(fd_, POLLOUT, deadline) == 0) throw CommTimeoutError("timed out sending");
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) throw SocketClosed("connection closed");
    SYS_CHECK(n);
  }
}

void Socket::recv_all(void* data, size_t nbytes, Deadline deadline) const {
  auto* bytes = static_cast<char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::recv(fd_, bytes, nbytes, MSG_DONTWAIT);
    if (n > 0) {
      bytes += n;
      nbytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw SocketClosed("connection closed");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (wait_fd(fd_, POLLIN, deadline) == 0) throw CommTimeoutError("timed out receiving");
      continue;
    }
    if (errno == ECONNRESET) throw SocketClosed("connection reset");
    SYS_CHECK(n);
  }
}

bool Socket::peer_closed() const {
  if (fd_ < 0) return true;
  pollfd pfd{fd_, POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0) return false;
  if (pfd.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char byte;
  ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

std::string local_hostname() {
  char name[256] = {};
  SYS_CHECK(gethostname(name, sizeof(name) - 1));
  return name;
}

std::string host_identity() {
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  // Shared memory needs the same /dev/shm, not only the same kernel: containers on
  // one machine share the boot id (and, with host networking or --hostname, the
  // name) but each mounts a tmpfs of its own on /dev/shm unless it is given the
  // host's (docker --ipc=host). The mount's device and inode tell them apart.
  struct stat shm {};
  const std::string shm_id = ::stat("/dev/shm", &shm) == 0
                                 ? detail::concat(major(shm.st_dev), ":", minor(shm.st_dev), ":", shm.st_ino)
                                 : std::string("none");
  return local_hostname() + "/" + boot_id + "/shm=" + shm_id;
}

}  // namespace ringtrain::comm
