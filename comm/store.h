// store.h: the TCP key-value store that ranks meet through (rendezvous).
//
// defines: StoreServer (runs on rank 0, one thread per client), Store (the
//          client every rank holds), kMaxStoreMessageBytes.
//
// What goes through it: each rank's listening address and host identity (so
// the ring backend can build its TCP mesh and decide shared memory vs TCP),
// the NCCL unique id, sub-group membership, the debug-mode collective
// signatures, the errors ranks publish when they fail, and the shutdown count.
// It is never on the data path of a collective.
//
// Wire format: every message is a 4-byte little-endian length followed by a
// MessagePack map (nlohmann-json's to_msgpack/from_msgpack, no hand parser).
// The first message of a connection must be {"op":"hello","token":...} with the
// job's token; anything else, a wrong token, a message over
// kMaxStoreMessageBytes, or bytes that are not MessagePack make the server
// answer with an error naming the problem and close that connection. The token
// keeps a stray process (another job on the same port, a port scanner) from
// joining; it is not a security boundary.
//
// Last will (the idea of MQTT's "last will and testament"): a client may leave a
// record with the server (set_last_will) that the server appends to a list in
// the store if the connection ends without a goodbye: the process was killed
// (kill -9, the OOM killer), crashed, or called _exit. A Store destroyed normally
// says goodbye first, and the will is dropped. This is how a rank killed while
// the others wait for it in setup (where there is no ring connection yet to
// close) is named within a fraction of a second instead of after the rendezvous
// timeout. Lists are kept as counters: <key>/count and <key>/<0..count-1>, the
// layout add() + set() give too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "comm/socket.h"

namespace ringtrain::comm {

inline constexpr size_t kMaxStoreMessageBytes = 64u << 20;

class StoreServer {
 public:
  // Listens on host:port (port 0 = any). port_hint names the setting to change when
  // the port is taken (e.g. "MASTER_PORT").
  StoreServer(const std::string& host, int port, std::string token,
              const std::string& port_hint = "MASTER_PORT");
  ~StoreServer();  // stops accepting, wakes and joins every client thread
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // Connections refused so far (bad token, malformed or oversized message); for tests.
  int rejected_connections() const { return rejected_.load(); }

 private:
  // One accepted connection. serve() closes the socket when it returns and marks
  // the entry finished; the accept loop then joins the thread and drops the entry.
  struct Client {
    std::unique_ptr<Socket> socket;
    std::thread thread;
    bool finished = false;
  };

  void accept_loop();
  void reap_finished_clients();
  void serve(uint64_t client_id);

  Socket listener_;
  std::string token_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> rejected_{0};
  std::mutex mutex_;               // guards data_, clients_, next_client_id_
  std::condition_variable changed_;  // notified on every set/add/stop
  std::map<std::string, std::string> data_;
  std::map<uint64_t, Client> clients_;  // live connections (and finished ones not yet joined)
  uint64_t next_client_id_ = 0;
  std::thread accept_thread_;
};

class Store {
 public:
  // Connects (retrying until connect_timeout: the server may start later) and
  // presents the token. Throws CommError if the server rejects it.
  Store(const std::string& host, int port, const std::string& token,
        std::chrono::milliseconds connect_timeout = std::chrono::seconds(60));
  // Says goodbye (the last will, if any, is dropped) and closes the connection.
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Leaves `record` with the server: if this connection ends without a goodbye,
  // the server appends it to the list under list_key (list_key/count is raised,
  // list_key/<count - 1> set). A later call replaces the will.
  void set_last_will(const std::string& list_key, const std::string& record);

  void set(const std::string& key, const std::string& value);
  // Blocks until the key exists; throws CommTimeoutError naming the key after `timeout`.
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  std::optional<std::string> try_get(const std::string& key);
  // Atomically adds delta to the integer under key (0 when absent); returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  void remove(const std::string& key);
  // Blocks until the integer under key is >= value (polling add(key, 0)).
  void wait_at_least(const std::string& key, int64_t value, std::chrono::milliseconds timeout);

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // Where peers can reach this host: the address set by set_advertised_address, else
  // the local address of the connection to the store (the interface that routes to it).
  std::string local_address() const {
    return advertised_address_.empty() ? socket_.local_address() : advertised_address_;
  }
  // For the process that runs the store and reaches it over loopback: the local
  // address would be 127.0.0.1, which no other host can use, so it names the
  // address every other rank reached the store at (MASTER_ADDR or the host name
  // rank 0 sent them) instead.
  void set_advertised_address(std::string address) { advertised_address_ = std::move(address); }

 private:
  std::string request(const std::string& op, const std::string& key, const std::string& value,
                      int64_t number, std::chrono::milliseconds timeout, bool* found);

  // A lock that serves waiters in arrival order. get() takes the connection for one
  // 200 ms slice after another; with std::mutex the thread that just released it
  // usually takes it again at once, so another thread's request (a comm thread reading
  // a peer's error) could wait for the whole get under load.
  class FifoLock {
   public:
    void lock() {
      std::unique_lock<std::mutex> guard(mutex_);
      const uint64_t ticket = next_ticket_++;
      turn_.wait(guard, [&] { return now_serving_ == ticket; });
    }
    void unlock() {
      {
        std::lock_guard<std::mutex> guard(mutex_);
        ++now_serving_;
      }
      turn_.notify_all();
    }

   private:
    std::mutex mutex_;
    std::condition_variable turn_;
    uint64_t next_ticket_ = 0, now_serving_ = 0;
  };

  std::string host_;
  int port_;
  FifoLock connection_lock_;  // one request at a time on the connection, in arrival order
  Socket socket_;
  std::string advertised_address_;  // empty: socket_'s local address
  std::string broken_;              // why the connection is unusable (a request failed midway)
  pid_t owner_pid_;                 // the process that connected: a forked child must not say goodbye
};

}  // namespace ringtrain::comm
