// socket.h: an owned TCP socket and the few blocking helpers the store and the
// TCP transport need.
//
// defines: Socket (RAII over one file descriptor, move-only), host_address
//          helpers, send_all/recv_all with a deadline.
//
// Every blocking call takes a Deadline and polls in short slices, so nothing
// here waits forever: a missing peer becomes a CommTimeoutError, a closed one a
// SocketClosed (which the process group turns into a PeerLostError naming the
// rank, because only it knows which rank sits behind the descriptor).
#pragma once

#include <optional>
#include <string>

#include "comm/types.h"

namespace ringtrain::comm {

// The other end closed the connection (EOF or ECONNRESET/EPIPE).
class SocketClosed : public CommError {
 public:
  using CommError::CommError;
};

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Binds host:port (port 0: any free port) and listens. host "" (or "::"): every
  // address, IPv6 and IPv4 (one dual-stack socket; IPv4 alone where the kernel has
  // no IPv6); "0.0.0.0": every IPv4 address; else the address `host` resolves to.
  // When the port is taken the error says so and names `port_hint` (e.g.
  // "MASTER_PORT") as the fix.
  static Socket listen(const std::string& host, int port, const std::string& port_hint = "");
  // Connects to host:port, retrying "connection refused" until `deadline` (the
  // server may not be up yet). Sets TCP_NODELAY. host: a name, an IPv4 address or an
  // IPv6 address (bare or in brackets); a name with both kinds of address is
  // reached over IPv4.
  static Socket connect(const std::string& host, int port, Deadline deadline);
  // Waits for one connection until `deadline`.
  Socket accept(Deadline deadline) const;
  // Accepts a connection that is already queued, without waiting: the socket (with
  // TCP_NODELAY, as accept gives it), or nullopt with accept4's errno in *error
  // (EMFILE: out of descriptors, ...), for callers that handle failures themselves.
  std::optional<Socket> accept_queued(int* error) const;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int local_port() const;
  // The local IP address of a connected socket: the address peers can reach us on
  // through the same interface (IPv4 dotted, or IPv6; an IPv4 peer of a dual-stack
  // listener gives plain IPv4, not ::ffff:a.b.c.d).
  std::string local_address() const;
  void set_nonblocking(bool on) const;
  void set_buffer_sizes(int bytes) const;

  void send_all(const void* data, size_t nbytes, Deadline deadline) const;
  void recv_all(void* data, size_t nbytes, Deadline deadline) const;
  // Non-blocking: true when the peer closed its end (EOF or error) and no data is waiting.
  bool peer_closed() const;
  // Wakes any thread blocked on this socket (shutdown(2)); the descriptor stays owned.
  void shutdown() const;
  void close();

 private:
  int fd_ = -1;
};

// TCP keepalive on every connection (store and ring mesh): a peer whose host
// went down or off the network (no FIN, no RST: nothing closes) is noticed after
// about RINGTRAIN_TCP_KEEPALIVE_SEC (default 60; 0 turns it off) of silence on an
// idle connection, and the connection then fails like a closed one (SocketClosed:
// "... timed out"). The kernel answers the probes, so a live process that is
// merely busy, stopped or slow is never taken for dead. Throws CommError for a
// value that is not a whole number of seconds (init_process_group calls it first;
// the socket functions below use 60 for such a value rather than throw, since they
// also run on the store's threads).
int tcp_keepalive_seconds();
// Sets SO_KEEPALIVE with idle = T/2, 5 probes T/10 apart (T = tcp_keepalive_seconds()).
void enable_keepalive(int fd);
// TCP_USER_TIMEOUT of tcp_keepalive_seconds() (nothing if 0): data sent and not
// acknowledged for that long fails the connection. Keepalive covers only idle
// connections; the store's are rarely idle (a waiting rank asks again every 200
// ms), so they take this too. Not for the ring mesh: there a receiver that is
// merely late (rank 0 saving a checkpoint while the others enter an allreduce)
// closes its window, and Linux would abort a sender stuck behind a closed window
// after the same time.
void limit_unacknowledged_time(int fd);
// Whether errno from send/recv means the connection is gone: the peer closed or
// reset it, or keepalive (or the retransmission limit) gave up on its host.
bool connection_gone(int error);

// "host:port", with an IPv6 address in brackets ("[fd00::2]:29500").
std::string host_port(const std::string& host, int port);
// 127.0.0.0/8 or ::1.
bool is_loopback_address(const std::string& address);

// This machine's name (gethostname).
std::string local_hostname();
// Identifies the machine and its shared memory, not only its name: hostname +
// kernel boot id + the /dev/shm mount (device and inode). Two ranks with the same
// host_identity can share memory; two containers on one machine with /dev/shm
// mounts of their own cannot, and get different identities.
std::string host_identity();

}  // namespace ringtrain::comm
