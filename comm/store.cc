#include "comm/store.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

namespace ringtrain::comm {

using nlohmann::json;

namespace {

// How long one blocking socket operation of the store protocol may take when the
// caller gave no tighter bound.
constexpr auto kIoTimeout = std::chrono::seconds(60);
// What a connection that has not yet shown the job's token may cost the server: its
// hello must come within kHelloTimeout and fit in kMaxHelloBytes (a real hello is
// under 100 bytes), so a stray cannot make rank 0 allocate 64 MiB or hold a
// descriptor and a thread forever by saying nothing. A client waits as long for the
// answer to its own hello.
constexpr auto kHelloTimeout = std::chrono::seconds(10);
constexpr size_t kMaxHelloBytes = 4096;
// How long the accept loop pauses when the process is out of descriptors.
constexpr auto kOutOfDescriptorsPause = std::chrono::milliseconds(100);

void write_message(const Socket& socket, const json& message, Deadline deadline) {
  std::vector<uint8_t> body = json::to_msgpack(message);
  RT_CHECK(body.size() <= kMaxStoreMessageBytes, "store: message of ", body.size(),
           " bytes exceeds the limit of ", kMaxStoreMessageBytes, " bytes");
  uint32_t length = static_cast<uint32_t>(body.size());
  uint8_t header[4] = {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
                       static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
  socket.send_all(header, 4, deadline);
  socket.send_all(body.data(), body.size(), deadline);
}

// How deep a message may nest. Store messages are one flat map; nlohmann's MessagePack
// reader recurses once per level, so a frame of nested one-element arrays (one byte a
// level) within the size limit would overflow the reading thread's stack and kill the
// process: rank 0's store, for any client that passed the hello (an env:// token is
// derived from the port and world size), or a client, for whatever holds the port.
constexpr size_t kMaxMessageDepth = 16;

// A parse that builds nothing and stops at the first level beyond kMaxMessageDepth,
// before from_msgpack, which would recurse that deep.
class DepthCheck : public nlohmann::json_sax<json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth_ <= kMaxMessageDepth; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth_, true; }
  bool start_array(std::size_t) override { return ++depth_ <= kMaxMessageDepth; }
  bool end_array() override { return --depth_, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
  bool too_deep() const { return depth_ > kMaxMessageDepth; }

 private:
  size_t depth_ = 0;
};

// Reads one framed message of at most max_bytes; throws CommError for oversized,
// too deeply nested or malformed ones.
json read_message(const Socket& socket, Deadline deadline,
                  size_t max_bytes = kMaxStoreMessageBytes) {
  uint8_t header[4];
  socket.recv_all(header, 4, deadline);
  uint32_t length = header[0] | (header[1] << 8) | (header[2] << 16) |
                    (static_cast<uint32_t>(header[3]) << 24);
  if (length > max_bytes) {
    throw CommError(detail::concat("store: message of ", length, " bytes exceeds the limit of ",
                                   max_bytes, " bytes", max_bytes < kMaxStoreMessageBytes ? " before the hello" : "",
                                   " (malformed or not a ringtrain client)"));
  }
  std::vector<uint8_t> body(length);
  socket.recv_all(body.data(), length, deadline);
  DepthCheck depth;
  json::sax_parse(body, &depth, json::input_format_t::msgpack, /*strict=*/true);
  if (depth.too_deep()) {
    throw CommError(detail::concat("store: malformed message (nested deeper than ", kMaxMessageDepth,
                                   " levels; a store message is one flat MessagePack map)"));
  }
  json message = json::from_msgpack(body, /*strict=*/true, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object() || !message.contains("op")) {
    if (!message.is_discarded() && message.is_object() && message.contains("ok")) return message;
    throw CommError("store: malformed message (not a MessagePack map with an \"op\")");
  }
  return message;
}

// The integer `text` spells out whole (what add() keeps under a key), or nullopt.
std::optional<int64_t> whole_integer(const std::string& text) {
  try {
    size_t used = 0;
    const int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

json binary_value(const std::string& value) {
  return json::binary(std::vector<uint8_t>(value.begin(), value.end()));
}

std::string string_value(const json& value) {
  const auto& bytes = value.get_binary();
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

// ---------------------------------------------------------------- server

StoreServer::StoreServer(const std::string& host, int port, std::string token,
                         const std::string& port_hint)
    : listener_(Socket::listen(host, port, port_hint)), token_(std::move(token)) {
  port_ = listener_.local_port();
  accept_thread_ = std::thread([this] { accept_loop(); });
}

StoreServer::~StoreServer() {
  stopping_ = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, client] : clients_) {
      if (client.socket) client.socket->shutdown();
    }
    changed_.notify_all();
  }
  listener_.shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  // No new clients now; the remaining threads were woken above (stopping_ ends them).
  for (auto& [id, client] : clients_) client.thread.join();
}

void StoreServer::reap_finished_clients() {
  std::vector<std::thread> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = clients_.begin(); it != clients_.end();) {
      if (!it->second.finished) {
        ++it;
        continue;
      }
      finished.push_back(std::move(it->second.thread));
      it = clients_.erase(it);
    }
  }
  // each of these has closed its socket and is past its last use of this object
  for (auto& thread : finished) thread.join();
}

void StoreServer::accept_loop() {
  bool told_out_of_descriptors = false;
  while (!stopping_) {
    reap_finished_clients();
    pollfd pfd{listener_.fd(), POLLIN, 0};
    int rc = ::poll(&pfd, 1, 100);
    if (rc <= 0 || stopping_) continue;
    if (pfd.revents & (POLLERR | POLLHUP | POLLNVAL)) break;
    int error = 0;
    std::optional<Socket> client;
    try {
      client = listener_.accept_queued(&error);
      // a client whose host vanished must fail this connection (its last will), also
      // with a reply of ours still unacknowledged
      if (client) limit_unacknowledged_time(client->fd());
    } catch (const std::exception& e) {
      // setting up this one connection failed (a socket option refused): drop it, and
      // go on serving the others; an exception here would end the process
      std::cerr << "ringtrain: store on port " << port_ << " dropped a connection it could not set up: "
                << e.what() << "\n";
      continue;
    }
    if (!client) {
      if (error == EMFILE || error == ENFILE) {
        // The connection stays queued and poll() keeps saying so: without a pause
        // this loop would spin at 100% CPU until a descriptor is freed.
        if (!told_out_of_descriptors) {
          std::cerr << "ringtrain: store on port " << port_ << " cannot accept a connection: "
                    << std::strerror(error) << "; it retries every "
                    << kOutOfDescriptorsPause.count() << " ms (raise the limit with ulimit -n, "
                    << "or find what holds the descriptors)\n";
          told_out_of_descriptors = true;
        }
        std::this_thread::sleep_for(kOutOfDescriptorsPause);
      }
      // otherwise a connection that vanished between poll and accept: nothing to serve
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t id = next_client_id_++;
    Client& entry = clients_[id];
    entry.socket = std::make_unique<Socket>(std::move(*client));
    entry.thread = std::thread([this, id] { serve(id); });
  }
}

void StoreServer::serve(uint64_t client_id) {
  Socket* socket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    socket = clients_.at(client_id).socket.get();
  }
  // However serve() returns, the connection is closed and the accept loop told that
  // this thread can be joined: one descriptor per connection ever made would
  // otherwise pile up until accept() fails with EMFILE.
  struct Finish {
    StoreServer* server;
    uint64_t id;
    ~Finish() {
      std::lock_guard<std::mutex> lock(server->mutex_);
      Client& client = server->clients_.at(id);
      client.socket.reset();
      client.finished = true;
    }
  } finish{this, client_id};
  const Deadline hello_deadline = Clock::now() + kHelloTimeout;
  auto reject = [&](const std::string& why) {
    ++rejected_;
    try {
      write_message(*socket, json{{"ok", false}, {"error", why}},
                    Clock::now() + std::chrono::seconds(1));
    } catch (const std::exception&) {
    }
    socket->shutdown();
  };
  // The client's last will (set_last_will), carried out below if the connection
  // ends without a goodbye while the store is still running.
  std::optional<std::pair<std::string, std::string>> will;
  struct CarryOutWill {
    StoreServer* server;
    std::optional<std::pair<std::string, std::string>>& will;
    ~CarryOutWill() {
      if (!will || server->stopping_) return;
      std::lock_guard<std::mutex> lock(server->mutex_);
      try {
        auto& data = server->data_;
        const std::string count_key = will->first + "/count";
        int64_t index = 0;
        if (auto it = data.find(count_key); it != data.end()) {
          index = whole_integer(it->second).value_or(0);  // not a count (someone set() it): the will goes first
        }
        data[count_key] = std::to_string(index + 1);
        data[detail::concat(will->first, "/", index)] = will->second;
      } catch (const std::exception&) {
        // out of memory: a destructor must not throw, and the store must go on serving
      }
      server->changed_.notify_all();
    }
  } carry_out_will{this, will};
  bool greeted = false;
  while (!stopping_) {
    json message;
    try {
      // Idle clients are normal (a rank between rendezvous steps): wait in slices.
      pollfd pfd{socket->fd(), POLLIN, 0};
      int rc = ::poll(&pfd, 1, 200);
      if (rc == 0 && !greeted && Clock::now() >= hello_deadline) {
        reject(detail::concat("store: connection refused: no hello within ",
                              kHelloTimeout.count(), " s"));
        return;
      }
      if (rc == 0) continue;
      if (rc < 0 && errno == EINTR) continue;  // a signal (e.g. SLURM's walltime USR1) hit this thread
      if (rc < 0) return;
      message = greeted ? read_message(*socket, Clock::now() + kIoTimeout)
                        : read_message(*socket, hello_deadline, kMaxHelloBytes);
    } catch (const SocketClosed&) {
      return;
    } catch (const CommTimeoutError& e) {
      // half a message, then silence (its host may be gone): the will stands
      if (stopping_) return;
      reject(e.what());
      return;
    } catch (const std::exception& e) {
      if (stopping_) return;
      will.reset();  // refused on purpose (a malformed frame): no death to report
      reject(e.what());
      return;
    }
    try {
      const std::string op = message.at("op").get<std::string>();
      if (!greeted) {
        if (op != "hello" || !message.contains("token") ||
            message["token"].get<std::string>() != token_) {
          // Two causes: another job's store on this port (two jobs given one MASTER_PORT,
          // or one derived from SLURM job ids), or a rank with a different token.
          reject("store: connection refused: wrong or missing job token. Either this port is another "
                 "job's store (two jobs on one host with the same MASTER_PORT, or a SLURM-derived port "
                 "in use: give this job a MASTER_PORT of its own), or this process is not part of the "
                 "job (set RINGTRAIN_JOB_TOKEN to the same value on every rank, or on none)");
          return;
        }
        greeted = true;
        write_message(*socket, json{{"ok", true}}, Clock::now() + kIoTimeout);
        continue;
      }
      const std::string key = message.at("key").get<std::string>();
      json reply{{"ok", true}};
      if (op == "bye") {  // a clean close: no will, no reply (the client is gone)
        will.reset();
        return;
      }
      if (op == "will") {
        will.emplace(key, string_value(message.at("value")));
        write_message(*socket, reply, Clock::now() + kIoTimeout);
        continue;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      if (op == "set") {
        data_[key] = string_value(message.at("value"));
        changed_.notify_all();
      } else if (op == "get") {
        // Clamped to a year: wait_for adds the timeout to now in nanoseconds, and a huge one
        // (INT64_MAX ms) overflowed into the past, so the get answered "not found" at once.
        constexpr int64_t kLongestGetMs = int64_t{365} * 24 * 3600 * 1000;
        auto timeout = std::chrono::milliseconds(std::clamp<int64_t>(message.at("timeout_ms").get<int64_t>(), 0, kLongestGetMs));
        bool found = changed_.wait_for(lock, timeout, [&] {
          return stopping_ || data_.count(key) > 0;
        });
        if (found && data_.count(key)) {
          reply["value"] = binary_value(data_[key]);
        } else {
          reply["found"] = false;
        }
      } else if (op == "try_get") {
        auto it = data_.find(key);
        if (it != data_.end()) reply["value"] = binary_value(it->second);
        else reply["found"] = false;
      } else if (op == "add") {
        auto it = data_.find(key);
        const std::optional<int64_t> old_value = it == data_.end() ? std::optional<int64_t>(0) : whole_integer(it->second);
        int64_t value = 0;
        if (old_value && __builtin_add_overflow(*old_value, message.at("number").get<int64_t>(), &value)) {
          // signed overflow is undefined (it wrapped): the caller's mistake too
          reply = json{{"ok", false},
                       {"error", detail::concat("add: the value under '", key, "' (", *old_value, ") plus ",
                                                message.at("number").get<int64_t>(), " overflows 64 bits")}};
        } else if (old_value) {
          data_[key] = std::to_string(value);
          reply["number"] = value;
          changed_.notify_all();
        } else {
          // the caller's mistake, not a broken connection: an error reply, and go on
          reply = json{{"ok", false}, {"error", detail::concat("add: the value under '", key, "' is not an integer")}};
        }
      } else if (op == "remove") {
        data_.erase(key);
      } else {
        lock.unlock();
        will.reset();  // refused on purpose: no death to report
        reject("store: unknown op '" + op + "'");
        return;
      }
      lock.unlock();
      write_message(*socket, reply, Clock::now() + kIoTimeout);
    } catch (const SocketClosed&) {
      return;
    } catch (const std::exception& e) {
      will.reset();  // refused on purpose: no death to report
      reject(std::string("store: malformed request: ") + e.what());
      return;
    }
  }
}

// ---------------------------------------------------------------- client

Store::Store(const std::string& host, int port, const std::string& token,
             std::chrono::milliseconds connect_timeout)
    : host_(host), port_(port), owner_pid_(getpid()) {
  Deadline deadline = Clock::now() + connect_timeout;
  socket_ = Socket::connect(host, port, deadline);
  limit_unacknowledged_time(socket_.fd());
  // A store answers the hello at once; whatever else holds the port (another service, a
  // stale process) may say nothing, or something that is not a store message. Either way
  // the error names the store and the likely cause, not just "timed out receiving", and
  // comes within kHelloTimeout, not at the end of the whole rendezvous.
  const Deadline hello_deadline = std::min(deadline, Clock::now() + kHelloTimeout);
  // what is left of the caller's connect_timeout may be less than kHelloTimeout
  const int64_t hello_seconds =
      (std::chrono::duration_cast<std::chrono::milliseconds>(hello_deadline - Clock::now()).count() + 999) / 1000;
  auto not_a_store = [&](const std::string& what) {
    return detail::concat("store at ", host_port(host, port), " ", what,
                          ": is MASTER_ADDR:MASTER_PORT this job's rank 0? Another service (or a process "
                          "of an earlier job) may hold the port");
  };
  json reply;
  try {
    write_message(socket_, json{{"op", "hello"}, {"token", token}}, hello_deadline);
    reply = read_message(socket_, hello_deadline);
  } catch (const SocketClosed&) {
    throw CommError(not_a_store("closed the connection during the handshake"));
  } catch (const CommTimeoutError& e) {
    throw CommTimeoutError(not_a_store(detail::concat("did not answer the handshake within ",
                                                      hello_seconds, " s (", e.what(), ")")));
  } catch (const std::exception& e) {
    throw CommError(not_a_store(detail::concat("answered the handshake with something else (", e.what(), ")")));
  }
  if (!reply.value("ok", false)) {
    throw StoreRefusedError(detail::concat("store at ", host_port(host, port), " refused this rank: ",
                                   reply.value("error", std::string("no reason given"))));
  }
}

Store::~Store() {
  // A forked child that exits through its destructors shares this connection with
  // its parent: its goodbye would be the parent's, and cut into its requests.
  if (getpid() != owner_pid_ || !socket_.valid()) return;
  std::lock_guard<FifoLock> lock(connection_lock_);
  if (!broken_.empty()) return;
  try {
    write_message(socket_, json{{"op", "bye"}, {"key", ""}}, Clock::now() + std::chrono::seconds(1));
  } catch (const std::exception&) {
    // the store is gone (rank 0 exited) or does not read: nothing to tell it
  }
}

void Store::set_last_will(const std::string& list_key, const std::string& record) {
  request("will", list_key, record, 0, std::chrono::milliseconds(0), nullptr);
}

std::string Store::request(const std::string& op, const std::string& key,
                           const std::string& value, int64_t number,
                           std::chrono::milliseconds timeout, bool* found) {
  json message{{"op", op}, {"key", key}};
  if (op == "set" || op == "will") message["value"] = binary_value(value);
  if (op == "add") message["number"] = number;
  if (op == "get") message["timeout_ms"] = timeout.count();
  // Refused here, before anything is sent: a throw inside the exchange below breaks
  // the connection for good, and the store would take this rank for dead.
  RT_CHECK(value.size() + key.size() + 64 <= kMaxStoreMessageBytes, "store ", op, " '", key, "': ",
           value.size(), " bytes exceed the store's limit of ", kMaxStoreMessageBytes, " bytes per message");
  std::lock_guard<FifoLock> lock(connection_lock_);
  if (!broken_.empty()) {
    throw CommError(detail::concat("store ", op, " '", key, "': the connection to the store at ",
                                   host_port(host_, port_), " is unusable since an earlier request failed midway (",
                                   broken_, ")"));
  }
  Deadline deadline = Clock::now() + timeout + kIoTimeout;
  json reply;
  try {
    write_message(socket_, message, deadline);
    reply = read_message(socket_, deadline);
  } catch (const SocketClosed& e) {
    broken_ = detail::concat("the connection ended: ", e.what());
    throw SocketClosed(detail::concat("the store at ", host_port(host_, port_), " (run by rank 0) is gone (",
                                      e.what(), "): rank 0 has exited, or its host went down or off the network"));
  } catch (const std::exception& e) {
    // A request cut off midway (a timeout, a signal) leaves its reply, or part of it,
    // in flight: the next request would read it as its own. So no next request.
    broken_ = detail::concat(op, " '", key, "': ", e.what());
    socket_.shutdown();
    throw;
  }
  if (!reply.value("ok", false)) {
    throw CommError(detail::concat("store ", op, " '", key, "' failed: ",
                                   reply.value("error", std::string("no reason given"))));
  }
  if (found) *found = reply.contains("value");
  if (op == "add") return std::to_string(reply.at("number").get<int64_t>());
  if (reply.contains("value")) return string_value(reply["value"]);
  return {};
}

void Store::set(const std::string& key, const std::string& value) {
  request("set", key, value, 0, std::chrono::milliseconds(0), nullptr);
}

std::string Store::get(const std::string& key, std::chrono::milliseconds timeout) {
  // Waited for on the server in short slices, so that the connection (one request at
  // a time) is free in between for the process's other threads: a comm thread that
  // must read a peer's error while the main thread waits minutes for a key.
  constexpr auto kSlice = std::chrono::milliseconds(200);
  const Deadline deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::milliseconds(std::max(0, millis_until(deadline)));
    bool found = false;
    std::string value = request("get", key, "", 0, std::min(left, kSlice), &found);
    if (found) return value;
    if (Clock::now() >= deadline) {
      throw CommTimeoutError(detail::concat("store: key '", key, "' did not appear within ",
                                            timeout.count(), " ms"));
    }
  }
}

std::optional<std::string> Store::try_get(const std::string& key) {
  bool found = false;
  std::string value = request("try_get", key, "", 0, std::chrono::milliseconds(0), &found);
  if (!found) return std::nullopt;
  return value;
}

int64_t Store::add(const std::string& key, int64_t delta) {
  return std::stoll(request("add", key, "", delta, std::chrono::milliseconds(0), nullptr));
}

void Store::remove(const std::string& key) {
  request("remove", key, "", 0, std::chrono::milliseconds(0), nullptr);
}

void Store::wait_at_least(const std::string& key, int64_t value,
                          std::chrono::milliseconds timeout) {
  Deadline deadline = Clock::now() + timeout;
  while (add(key, 0) < value) {
    if (Clock::now() >= deadline) {
      throw CommTimeoutError(detail::concat("store: counter '", key, "' did not reach ", value,
                                            " within ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace ringtrain::comm
