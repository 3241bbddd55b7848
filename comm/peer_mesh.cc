// peer_mesh.cc: PeerMesh, the connections of one ring-backend group, and the
// exchange() loop every ring algorithm is written in.
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "comm/init.h"
#include "comm/reduce.h"
#include "comm/shm_segment.h"
#include "comm/transport.h"
#include "comm/wait_in_slices.h"

namespace ringtrain::comm {

using nlohmann::json;

namespace {

constexpr uint32_t kHandshakeMagic = 0x52544d31;  // "RTM1"

// The first bytes on every mesh connection: who is calling, for which job and group.
struct Handshake {
  uint32_t magic;
  uint32_t rank;        // the caller's rank in the group
  uint64_t token_hash;  // fnv1a(job token)
  uint64_t group_hash;  // fnv1a(group prefix)
};

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// How a rank waits on shared memory, where there is no descriptor to sleep on:
// spin briefly (the peer is usually a few hundred ns behind), then give the core
// away, then nap. Returns true every 64th round once past the spin: time to check
// the deadline and whether the peers are still alive.
bool shared_memory_backoff(uint64_t idle_rounds) {
  if (idle_rounds < 256) {
    cpu_relax();
    return false;
  }
  if (idle_rounds < 4096) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return idle_rounds % 64 == 0;
}

// What PeerMesh compares across ranks, in the words of the variables that set it.
std::string transport_settings(const std::string& transport, const ShmLayout& layout) {
  if (transport == "tcp") return "RINGTRAIN_TRANSPORT=tcp";
  return detail::concat("RINGTRAIN_TRANSPORT=", transport, " RINGTRAIN_SHM_SLOT_BYTES=",
                        layout.slot_bytes, " RINGTRAIN_SHM_SLOTS=", layout.slots);
}

}  // namespace

PeerMesh::PeerMesh(Store& store, const std::string& prefix, int rank, int size,
                   const std::vector<int>& world_ranks, const std::string& token,
                   const std::string& transport, Deadline deadline, const MemberCheck& check_members)
    : rank_(rank), size_(size), peers_(size), check_published_(check_members) {
  RT_CHECK(transport == "auto" || transport == "tcp" || transport == "shm",
           "ring transport '", transport, "' is not one of auto, tcp, shm (RINGTRAIN_TRANSPORT)");
  for (int r = 0; r < size; ++r) peers_[r].world_rank = world_ranks[r];
  if (size == 1) return;
  auto timeout = std::chrono::milliseconds(millis_until(deadline));

  // 1. Publish where we listen (the address the store connection goes out on is
  //    one the other hosts can route to) and which host we are on.
  //    The transport settings go along: ranks that choose transports differently
  //    wait on each other until the timeout, and ranks whose slots are cut
  //    differently read each other's channels wrongly (silently, when the segment
  //    sizes happen to agree), so they are compared before anything is connected.
  Socket listener = Socket::listen("", 0);
  const ShmLayout layout = transport == "tcp" ? ShmLayout{} : ShmLayout::from_env(1);
  json me{{"addr", store.local_address()}, {"port", listener.local_port()},
          {"host", host_identity()}, {"pid", static_cast<int>(getpid())},
          {"settings", transport_settings(transport, layout)}};
  // Rank 0's nonce joins the job token in the mesh handshake: a token derived from the
  // launch variables (port, world size) is the same for two jobs whose masters are
  // different hosts that happen to share MASTER_PORT, and a mesh port freed by one job
  // and taken by the other must not let the two meet.
  if (rank == 0) me["nonce"] = random_job_token();
  store.set(prefix + "/mesh/" + std::to_string(rank), me.dump());
  std::vector<json> info(size);
  for (int r = 0; r < size; ++r) {
    try {
      const std::string key = prefix + "/mesh/" + std::to_string(r);
      info[r] = json::parse(wait_in_slices(
          deadline, check_members, detail::concat("rank ", world_ranks[r], " to join the ring mesh"),
          [&](Deadline slice) { return store.get(key, std::chrono::milliseconds(millis_until(slice))); }));
    } catch (const CommTimeoutError&) {
      throw CommTimeoutError(detail::concat(
          "ring backend: rank ", world_ranks[r], " of ", size, " did not join within ",
          (timeout.count() + 999) / 1000, " s (rank ", world_ranks[rank],
          " waited for it): it was not started, failed before init_process_group, or was "
          "given another world size or master address. Start every rank (ringrun "
          "--nnodes/--nproc-per-node, srun -n, mpirun -np) with the same settings; raise the "
          "limit with RINGTRAIN_RENDEZVOUS_TIMEOUT_SEC"));
    }
  }
  // Every rank compares every rank with rank 0, so all of them fail at once, naming
  // the same pair, instead of the odd one out failing and the rest timing out.
  for (int r = 1; r < size; ++r) {
    if (info[r]["settings"] == info[0]["settings"]) continue;
    throw CommError(detail::concat(
        "ring backend: rank ", world_ranks[r], " has ", info[r]["settings"].get<std::string>(),
        " but rank ", world_ranks[0], " has ", info[0]["settings"].get<std::string>(),
        "; set them the same on every rank (or unset them)"));
  }

  // 2. Full mesh: connect to every lower rank, accept every higher one. Connections
  //    only go downwards, so no two ranks wait on each other's accept.
  const std::string job_token = token + "|" + info[0].value("nonce", std::string());
  const Handshake mine{kHandshakeMagic, static_cast<uint32_t>(rank), fnv1a(job_token), fnv1a(prefix)};
  for (int peer = 0; peer < rank; ++peer) {
    const std::string addr = info[peer]["addr"].get<std::string>();
    const std::string waiting_for = detail::concat("rank ", world_ranks[peer], " to accept its mesh connection");
    Socket socket;
    try {
      socket = wait_in_slices(deadline, check_members, waiting_for, [&](Deadline slice) {
        return Socket::connect(addr, info[peer]["port"].get<int>(), slice);
      });
    } catch (const CommError& e) {
      // A peer on another host that published a loopback address reached the store
      // over loopback: MASTER_ADDR resolves to 127.x on its host (Debian's /etc/hosts
      // maps the host name to 127.0.1.1). (Hosts that share a network namespace, such
      // as containers with host networking, can connect anyway: only a failure says so.)
      const bool loopback_elsewhere = info[peer]["host"] != info[rank]["host"] && is_loopback_address(addr);
      throw CommError(detail::concat(
          "ring backend: rank ", world_ranks[rank], " cannot connect to rank ", world_ranks[peer], " at ",
          host_port(addr, info[peer]["port"].get<int>()), " (the address it published): ", e.what(),
          loopback_elsewhere
              ? detail::concat(". Rank ", world_ranks[peer], " is on another host and published a loopback "
                               "address, because it reached the store at MASTER_ADDR over loopback: set "
                               "MASTER_ADDR to an address of the master that every host can route to (its "
                               "IP address, not a name its /etc/hosts maps to 127.0.1.1)")
              : std::string()));
    }
    socket.send_all(&mine, sizeof(mine), deadline);
    // The reply comes once the peer has connected to the ranks below it and reached
    // its accept loop.
    uint8_t accepted = 0;
    try {
      wait_in_slices(deadline, check_members, waiting_for, [&](Deadline slice) {
        socket.recv_all(&accepted, 1, slice);
        return 0;
      });
    } catch (const SocketClosed& e) {
      check_members(waiting_for);  // its own explanation, when it published one
      throw CommError(detail::concat("ring backend: rank ", world_ranks[peer], " closed the mesh connection from rank ",
                                     world_ranks[rank], " before it answered (", e.what(),
                                     "): did its process exit during init_process_group?"));
    }
    if (!accepted) {
      throw CommError(detail::concat("rank ", world_ranks[peer], " refused the connection from rank ",
                                     world_ranks[rank], ": job token or group mismatch (do all "
                                     "ranks have the same RINGTRAIN_JOB_TOKEN?)"));
    }
    peers_[peer].socket = std::move(socket);
  }
  for (int expected = size - 1 - rank; expected > 0;) {
    std::string missing;
    for (int r = rank + 1; r < size; ++r)
      if (!peers_[r].socket.valid()) missing += detail::concat(missing.empty() ? "" : ", ", world_ranks[r]);
    Socket socket;
    try {
      socket = wait_in_slices(deadline, check_members, detail::concat("rank(s) ", missing, " to connect to it"),
                         [&](Deadline slice) { return listener.accept(slice); });
    } catch (const CommTimeoutError& e) {
      throw CommTimeoutError(detail::concat(
          "ring backend: rank ", world_ranks[rank], " waited for rank(s) ", missing, " to connect to it at ",
          host_port(info[rank]["addr"].get<std::string>(), listener.local_port()), " and they did not (",
          e.what(), "): did they fail to join, or can they not route to that address?"));
    }
    Handshake theirs{};
    try {
      socket.recv_all(&theirs, sizeof(theirs), std::min(deadline, Clock::now() + std::chrono::seconds(5)));
    } catch (const CommError&) {
      std::cerr << "ringtrain: dropped a connection that sent no handshake\n";
      continue;
    }
    bool valid = theirs.magic == kHandshakeMagic && theirs.token_hash == mine.token_hash &&
                 theirs.group_hash == mine.group_hash && static_cast<int>(theirs.rank) > rank &&
                 static_cast<int>(theirs.rank) < size && !peers_[theirs.rank].socket.valid();
    uint8_t reply = valid ? 1 : 0;
    try {
      socket.send_all(&reply, 1, deadline);
    } catch (const CommError&) {
      continue;
    }
    if (!valid) {
      std::cerr << "ringtrain: rank " << world_ranks[rank]
                << " rejected a connection without this job's token or group\n";
      continue;
    }
    peers_[theirs.rank].socket = std::move(socket);
    --expected;
  }

  // 3. Transports. Ranks on this host (same hostname, boot id and /dev/shm) share memory
  //    unless "tcp" was asked for.
  std::vector<int> local;  // group ranks on this host, ascending
  for (int r = 0; r < size; ++r) {
    if (info[r]["host"] == info[rank]["host"]) local.push_back(r);
  }
  if (transport == "shm" && static_cast<int>(local.size()) != size) {
    throw CommError("RINGTRAIN_TRANSPORT=shm, but not every rank of the group is on this host; "
                    "use auto (shared memory on one host, TCP between hosts) or tcp");
  }
  std::vector<int> local_index(size, -1);
  for (size_t i = 0; i < local.size(); ++i) local_index[local[i]] = static_cast<int>(i);
  const bool use_shm = transport != "tcp" && local.size() > 1;
  if (use_shm) {
    // the layout checked above, now with one channel per rank on this host
    const ShmLayout local_layout = ShmLayout::from_env(static_cast<int>(local.size()));
    shm_name_prefix_ = detail::concat("/ringtrain-", hex(fnv1a(token + "|" + prefix)), "-r", rank,
                                      "-p", getpid());
    // One inbox per rank, shared among the ranks of this host (the key names the host).
    auto segment_of = share_shm_segments(
        store, prefix + "/shm/" + hex(fnv1a(info[rank]["host"].get<std::string>())), rank, size,
        local, world_ranks, shm_name_prefix_, local_layout.segment_bytes(), deadline,
        [this](const std::string& what) { this->check_members(what); }, "shared-memory transport",
        "set RINGTRAIN_SHM_SLOT_BYTES and RINGTRAIN_SHM_SLOTS the same on every rank");
    for (int r : local) {
      if (r == rank) continue;
      peers_[r].transport = make_shm_transport(segment_of[rank], local_index[r], segment_of[r],
                                               local_index[rank], local_layout);
      ++shm_peers_;
    }
    for (auto& segment : segment_of) {
      if (segment) segments_.push_back(segment);
    }
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank || peers_[r].transport) continue;
    peers_[r].socket.set_buffer_sizes(4 << 20);
    peers_[r].transport = make_tcp_transport(peers_[r].socket);
  }
}

PeerMesh::~PeerMesh() = default;

const char* PeerMesh::transport_kind(int peer) const {
  return peer == rank_ || !peers_[peer].transport ? "self" : peers_[peer].transport->kind();
}

void PeerMesh::close() {
  closed_ = true;
  for (auto& peer : peers_) peer.socket.shutdown();
}

void PeerMesh::lost(int peer, const char* what) const {
  throw PeerLostError(peers_[peer].world_rank,
                      detail::concat("rank ", peers_[peer].world_rank, " closed its connection (",
                                     what, ")"));
}

void PeerMesh::recv(int peer, void* dst, size_t nbytes, Deadline deadline) {
  char* out = static_cast<char*>(dst);
  exchange(-1, nullptr, 0, peer, nbytes,
           [out](const void* piece, size_t offset, size_t n) { copy_bytes(out + offset, piece, n); },
           deadline);
}

void PeerMesh::exchange(int send_peer, const void* send_data, size_t send_bytes, int recv_peer,
                        size_t recv_bytes, const RecvSink& sink, Deadline deadline,
                        FollowUp* follow_up) {
  if (send_peer < 0) send_bytes = 0;
  if (recv_peer < 0) recv_bytes = 0;
  const char* out = static_cast<const char*>(send_data);
  size_t sent = 0;
  size_t received = 0;
  uint64_t idle_rounds = 0;
  int suspect = -1;  // a shared-memory peer whose socket was found closed
  while (sent < send_bytes || received < recv_bytes) {
    if (closed_) throw CommError("the process group was shut down after a failure");
    bool progress = false;
    if (sent < send_bytes) {
      try {
        size_t n = peers_[send_peer].transport->try_send(out + sent, send_bytes - sent);
        sent += n;
        progress |= n > 0;
      } catch (const SocketClosed& e) {
        lost(send_peer, e.what());
      }
    } else if (follow_up && send_peer >= 0 && follow_up->sent < follow_up->ready) {
      // the first message is out: stream what the sink has finished of the second
      try {
        size_t n = peers_[send_peer].transport->try_send(follow_up->data + follow_up->sent,
                                                         follow_up->ready - follow_up->sent);
        follow_up->sent += n;
        progress |= n > 0;
      } catch (const SocketClosed& e) {
        lost(send_peer, e.what());
      }
    }
    if (received < recv_bytes) {
      try {
        size_t n = peers_[recv_peer].transport->try_recv(received, recv_bytes - received, sink);
        received += n;
        progress |= n > 0;
      } catch (const SocketClosed& e) {
        lost(recv_peer, e.what());
      }
    }
    if (progress) {
      idle_rounds = 0;
      suspect = -1;
      continue;
    }
    // A peer found closed last round and still nothing moved: it is gone.
    if (suspect >= 0) lost(suspect, "process exited or was killed");
    suspect = wait_for_progress(sent < send_bytes ? send_peer : -1,
                                received < recv_bytes ? recv_peer : -1, ++idle_rounds, deadline);
  }
}

// Nothing moved this round. TCP: sleep in poll(); shared memory: back off
// (shared_memory_backoff). Now and then check the deadline and that the peers we
// wait on still exist. Returns a peer whose socket is closed, or -1.
int PeerMesh::wait_for_progress(int send_peer, int recv_peer, uint64_t idle_rounds,
                                 Deadline deadline) {
  auto waiting_on = [&](int peer) { return peer >= 0 ? peers_[peer].transport.get() : nullptr; };
  Transport* send_side = waiting_on(send_peer);
  Transport* recv_side = waiting_on(recv_peer);
  const bool all_tcp = (!send_side || send_side->poll_fd() >= 0) &&
                       (!recv_side || recv_side->poll_fd() >= 0);
  if (all_tcp) {
    // TCP: sleep in poll() until a socket is ready (EOF and errors wake it too).
    pollfd fds[2];
    int count = 0;
    if (send_side) fds[count++] = {send_side->poll_fd(), POLLOUT, 0};
    if (recv_side) fds[count++] = {recv_side->poll_fd(), POLLIN, 0};
    ::poll(fds, count, std::min(millis_until(deadline), 50));
  } else if (!shared_memory_backoff(idle_rounds)) {
    return -1;
  }
  if (Clock::now() >= deadline) {
    int peer = recv_peer >= 0 ? recv_peer : send_peer;
    throw CommTimeoutError(detail::concat("no progress from rank ", peers_[peer].world_rank,
                                          " before the deadline"));
  }
  // A shared-memory peer gives no EOF of its own: its TCP socket does. Data it wrote
  // before dying is still consumable, so the caller makes one more round before it
  // calls the peer lost.
  for (int peer : {send_peer, recv_peer}) {
    if (peer >= 0 && peers_[peer].transport->poll_fd() < 0 && peers_[peer].socket.peer_closed()) {
      return peer;
    }
  }
  return -1;
}

void PeerMesh::check_members(const std::string& what) const {
  // our own sockets are shut (close()): every peer would look gone
  if (closed_) throw CommError("the process group was shut down after a failure");
  if (check_published_) check_published_(what);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !peers_[peer].socket.valid() || !peers_[peer].socket.peer_closed()) continue;
    // Its process is gone or gave up. The store's record of it says more (how, its
    // pid and host) and comes a moment after the connection closes: give it that
    // (up to 2 s: the store's thread may be slow to run on a loaded machine).
    for (int look = 0; look < 20 && check_published_; ++look) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      check_published_(what);
    }
    throw PeerLostError(peers_[peer].world_rank,
                        detail::concat("rank ", peers_[peer].world_rank, " closed its connection (process exited or "
                                       "was killed) while rank ", peers_[rank_].world_rank, " waited for ", what));
  }
}

void PeerMesh::wait_until(const std::function<bool()>& ready, Deadline deadline,
                          const char* what) {
  for (uint64_t idle_rounds = 1; !ready(); ++idle_rounds) {
    if (closed_) throw CommError("the process group was shut down after a failure");
    if (!shared_memory_backoff(idle_rounds)) continue;
    if (Clock::now() >= deadline) {
      throw CommTimeoutError(detail::concat("no progress before the deadline while waiting for ",
                                            what));
    }
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || !peers_[peer].socket.peer_closed()) continue;
      if (ready()) return;  // it finished its part before it went away
      lost(peer, "process exited or was killed");
    }
  }
}

}  // namespace ringtrain::comm
