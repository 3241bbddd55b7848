#include "comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

namespace ringtrain::comm {

int millis_until(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

namespace {

// An IPv4 or IPv6 socket address, as bind/connect take it.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// "[fd00::2]" (as in a URL) -> "fd00::2"; anything else unchanged.
std::string without_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

// The address of `host` (a name, a dotted IPv4 address or an IPv6 address) with
// `port`, or nullopt with the resolver's reason in *error. A name with both kinds
// of address gives its IPv4 one: IPv4 is what every cluster routes, while an IPv6
// address a name also has is not always reachable from the other hosts (and a SYN
// into such a void would wait out the deadline). A name or literal with only IPv6
// addresses gives the first of them.
std::optional<SocketAddress> try_resolve(const std::string& host, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const std::string name = without_brackets(host);
  int rc = getaddrinfo(name.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    *error = detail::concat("cannot resolve host '", host, "': ", gai_strerror(rc),
                            " (check MASTER_ADDR / the node list)");
    return std::nullopt;
  }
  const addrinfo* chosen = nullptr;
  for (const addrinfo* a = result; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      chosen = a;
      break;
    }
    if (a->ai_family == AF_INET6 && !chosen) chosen = a;
  }
  if (!chosen) {
    freeaddrinfo(result);
    *error = detail::concat("host '", host, "' has no IPv4 or IPv6 address");
    return std::nullopt;
  }
  SocketAddress address;
  std::memcpy(&address.storage, chosen->ai_addr, chosen->ai_addrlen);
  address.length = chosen->ai_addrlen;
  freeaddrinfo(result);
  const uint16_t net_port = htons(static_cast<uint16_t>(port));
  if (address.family() == AF_INET) reinterpret_cast<sockaddr_in*>(&address.storage)->sin_port = net_port;
  else reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_port = net_port;
  return address;
}

SocketAddress resolve(const std::string& host, int port) {
  std::string error;
  std::optional<SocketAddress> addr = try_resolve(host, port, &error);
  if (!addr) throw CommError(error);
  return *addr;
}

// The "any address" to listen on: IPv6's, accepting IPv4 too (v4-mapped), where the
// kernel has IPv6; else IPv4's.
std::pair<Socket, SocketAddress> any_address_socket(int port) {
  SocketAddress address;
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int zero = 0;
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) == 0) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&address.storage);
      in6->sin6_family = AF_INET6;
      in6->sin6_addr = in6addr_any;
      in6->sin6_port = htons(static_cast<uint16_t>(port));
      address.length = sizeof(sockaddr_in6);
      return {Socket(fd), address};
    }
    ::close(fd);
  }
  // no IPv6 here (ipv6.disable=1), or no dual stack: IPv4 only
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SYS_CHECK(fd);
  auto* in = reinterpret_cast<sockaddr_in*>(&address.storage);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_ANY);
  in->sin_port = htons(static_cast<uint16_t>(port));
  address.length = sizeof(sockaddr_in);
  return {Socket(fd), address};
}

// The text of an address (v4-mapped IPv6 as plain IPv4; a link-local IPv6 address
// with its %interface) and its port.
std::pair<std::string, int> address_text(const sockaddr_storage& storage) {
  char text[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = {};
  if (storage.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(storage);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
      char interface[IF_NAMESIZE] = {};
      if (in6.sin6_scope_id != 0 && if_indextoname(in6.sin6_scope_id, interface)) {
        std::strcat(text, "%");
        std::strcat(text, interface);
      }
    }
    return {text, ntohs(in6.sin6_port)};
  }
  const auto& in = reinterpret_cast<const sockaddr_in&>(storage);
  inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
  return {text, ntohs(in.sin_port)};
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
  // "" or "::": every address, IPv6 and IPv4; "0.0.0.0": every IPv4 address.
  Socket sock;
  SocketAddress addr;
  if (host.empty() || host == "::" || host == "[::]") {
    std::tie(sock, addr) = any_address_socket(port);
  } else {
    addr = resolve(host, port);
    sock = Socket(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    SYS_CHECK(sock.fd());
  }
  const int fd = sock.fd();
  int one = 1;
  SYS_CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
  if (::bind(fd, addr.get(), addr.length) != 0) {
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
    throw CommError(detail::concat("cannot bind ", host_port(host.empty() ? "*" : host, port), ": ",
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
    std::optional<SocketAddress> resolved = try_resolve(host, port, &resolve_error);
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
    const SocketAddress& addr = *resolved;
    int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
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
    if (::connect(fd, addr.get(), addr.length) != 0) {
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
      enable_keepalive(fd);
      return sock;
    }
    last_error = std::strerror(err);
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  throw CommTimeoutError(detail::concat("cannot connect to ", host_port(host, port), " (", last_error,
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
  enable_keepalive(fd);
  return client;
}

int Socket::local_port() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  SYS_CHECK(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len));
  return address_text(addr).second;
}

std::string Socket::local_address() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  SYS_CHECK(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len));
  return address_text(addr).first;
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
    if (n < 0 && connection_gone(errno)) throw SocketClosed(detail::concat("connection closed (", std::strerror(errno), ")"));
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
    if (connection_gone(errno)) throw SocketClosed(detail::concat("connection lost (", std::strerror(errno), ")"));
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

int tcp_keepalive_seconds() {
  const char* text = std::getenv("RINGTRAIN_TCP_KEEPALIVE_SEC");
  if (!text || !*text) return 60;
  char* end = nullptr;
  errno = 0;
  const long seconds = std::strtol(text, &end, 10);
  // At most 32767: Linux refuses a keepalive idle time (T/2) or interval above that.
  if (*end != '\0' || errno != 0 || seconds < 0 || seconds > 32767 || !std::isdigit(static_cast<unsigned char>(*text))) {
    throw CommError(detail::concat("RINGTRAIN_TCP_KEEPALIVE_SEC='", text,
                                   "' is not a whole number of seconds in [0, 32767]; unset it (60) or give "
                                   "one such as 30, or 0 for no keepalive"));
  }
  return static_cast<int>(seconds);
}

// The setting for a socket: a bad value (init_process_group reports it) gives the
// default here, since sockets are also made on the store's own threads.
int keepalive_seconds_or_default() {
  try {
    return tcp_keepalive_seconds();
  } catch (const CommError&) {
    return 60;
  }
}

void enable_keepalive(int fd) {
  const int total = keepalive_seconds_or_default();
  if (total == 0) return;
  const int one = 1;
  const int idle = std::max(1, total / 2);
  const int interval = std::max(1, total / 10);
  const int probes = 5;
  SYS_CHECK(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)));
  SYS_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)));
  SYS_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)));
  SYS_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes)));
}

void limit_unacknowledged_time(int fd) {
  const unsigned milliseconds = static_cast<unsigned>(keepalive_seconds_or_default()) * 1000u;
  if (milliseconds == 0) return;
  SYS_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &milliseconds, sizeof(milliseconds)));
}

bool connection_gone(int error) {
  return error == EPIPE || error == ECONNRESET || error == ENOTCONN || error == ETIMEDOUT ||
         error == EHOSTUNREACH || error == ENETUNREACH || error == EHOSTDOWN;
}

std::string host_port(const std::string& host, int port) {
  const bool ipv6_literal = host.find(':') != std::string::npos && host.front() != '[';
  return ipv6_literal ? detail::concat("[", host, "]:", port) : detail::concat(host, ":", port);
}

bool is_loopback_address(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address == "[::1]";
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
