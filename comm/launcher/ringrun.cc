// ringrun: start N worker processes of one program on this node, the way
// torchrun does, and keep them together.
//
//   ringrun --nproc-per-node 4 ./train --epochs 3
//   ringrun --nnodes 2 --node-rank 0 --master-addr node1 --master-port 29500 ./train   (on node1)
//   ringrun --nnodes 2 --node-rank 1 --master-addr node1 --master-port 29500 ./train   (on node2)
//
// Each worker gets the env:// variables: MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
// RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK, and RINGTRAIN_JOB_TOKEN
// when there is one: --job-token or the environment's, else a random one on one node.
// On several nodes without one it is not set, and env:// derives the token from what
// every node shares (master port, world size), leaving the master's address out:
// nodes that name the master differently (node1, node1.cluster, its IP) are one job.
//
// Supervision: the workers run in their own process group, so a Ctrl-C reaches
// them only through ringrun, which forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT,
// SIGUSR1 and SIGUSR2 to every worker (SLURM's walltime SIGUSR1 included). When a
// worker fails (non-zero exit or a signal), ringrun sends SIGTERM to the others,
// SIGKILL after --stop-timeout seconds, and exits with the failed worker's status
// (its exit code, or 128 + the signal number, as a shell reports it). A stop signal
// from outside (SIGINT, SIGTERM, SIGHUP, SIGQUIT: scancel, the walltime) gives the
// workers --signal-timeout seconds (30, SLURM's default KillWait) before SIGKILL,
// time to write the checkpoint they write on SIGTERM; then, the workers gone, ringrun
// dies of that signal itself (see Exit status). A signal ringrun was started
// with ignored (SIGHUP under nohup, SIGINT and SIGQUIT in a script's background job)
// stays ignored: not forwarded, no stop. SIGCHLD is reset to the default at start-up
// (ignored, it would have the kernel reap the workers unseen).
//
// Exit status: 0 when every worker exited 0. A worker failed first: its exit code, or
// 128 + the signal that killed it or stopped it (SIGTTIN/SIGTTOU), as a shell reports
// it. A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) came first, while workers ran:
// after the clean-up ringrun kills itself with that signal (default disposition, no
// core dump for SIGQUIT), as a shell's child dies of Ctrl-C; a shell shows 128 + the
// signal (130 for SIGINT), and a script running ringrun stops on Ctrl-C instead of
// going on with its next command (bash aborts a script only when the child it waited
// for died of SIGINT). 2 for a usage error, 1 when ringrun cannot start the workers.
//
// Leftovers: ringrun is a child subreaper (PR_SET_CHILD_SUBREAPER), so whatever a
// worker started and left behind is reparented to ringrun and reaped by it. It
// remembers every worker's process group: on a failure or a stop signal it signals
// every group that still has members, the failed or finished worker's included, and
// when the workers have all exited, it sends what is left in their groups (a
// background child, a data-loader process) SIGTERM, then SIGKILL after
// --stop-timeout, and exits only once those groups are empty, with the status
// above. Nothing the workers started lives on in their process groups. Killed
// outright itself (kill -9, the OOM killer), ringrun cleans up nothing: its workers
// die (PR_SET_PDEATHSIG), and a guardian process it forked at start-up (run_guardian)
// sends SIGKILL to what is left in their process groups (a worker that is `bash
// train.sh` and its program). A process that left its worker's group (setsid,
// setpgid) is not followed, in either case.
//
// Shared memory: the comm layer names its /dev/shm segments after the process that
// creates them (/ringtrain-<group hash>-r<rank>-p<pid>[-sym-<n>], peer_mesh.cc) and
// removes each name once every peer has mapped it, or when the rendezvous fails. A
// process killed during that rendezvous (the transport's setup, allocate_symmetric)
// cannot: its names would stay in /dev/shm, holding their memory, until a reboot.
// So for every process ringrun reaps (a worker, or one reparented to it) it removes
// the /dev/shm/ringtrain-* names with that pid: their creator is gone, and a name is
// only ever opened by the peers of a rendezvous still under way with it.
//
// Terminal: the workers are not in the terminal's foreground process group, so one
// that reads the terminal would be stopped (SIGTTIN) for good. As under mpirun,
// every worker but rank 0 reads /dev/null, and rank 0 reads ringrun's standard input
// only when that is not a terminal (a pipe, a file), else /dev/null too. A worker
// stopped by SIGTTIN or SIGTTOU all the same (it opened /dev/tty) is reported by
// rank and counts as failed (status 128 + the signal), instead of a silent hang.
//
// Arguments: ringrun's options come first; the first argument that is not one of
// them is the program, and everything after it is the program's. An argument that
// starts with '-' where the program name should be is an unknown option, an error
// (torchrun's underscore spellings get the dashed one suggested); after "--" any
// argument is the program's: ringrun --nproc-per-node 2 -- ./train --epochs 3.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct Worker {
  pid_t pid = -1;
  int rank = 0;
  bool running = false;    // not reaped yet
  pid_t pgid = -1;         // its process group (led by it), which outlives it while members remain
  bool group_live = false; // the group may still have members; false once kill(-pgid, 0) says ESRCH
};

std::string random_token() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
  std::string text;
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    text += hex;
  }
  return text;
}

// True when nothing listens on the port yet (rank 0's store will bind it). Tried the
// way the store binds: one dual-stack socket (IPv6 and IPv4), IPv4 alone where the
// kernel has no IPv6.
bool port_is_free(int port) {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd >= 0) {
    int zero = 0, one = 1;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    addr.sin6_addr = in6addr_any;
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return free;
  }
  fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return true;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return free;
}

int status_to_exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "stopped";
}

// Removes the shared-memory segments that process `pid`, just reaped, left in
// /dev/shm (see the top of the file): names "ringtrain-...-p<pid>" and
// "ringtrain-...-p<pid>-...". Returns how many. The pid was this process's child's
// until now, so on this host (this pid namespace) no other process holds it. Best
// effort: a /dev/shm that cannot be read is skipped.
int remove_shm_leftovers(pid_t pid) {
  const std::string tag = "-p" + std::to_string(pid);
  int removed = 0;
  std::error_code error;
  for (std::filesystem::directory_iterator it("/dev/shm", error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("ringtrain-", 0) != 0) continue;
    const bool ends_with_tag = name.size() >= tag.size() && name.compare(name.size() - tag.size(), tag.size(), tag) == 0;
    if (!ends_with_tag && name.find(tag + "-") == std::string::npos) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  return removed;
}

// The error for `arg`, an unknown option given before the program name. torchrun spells
// its options with underscores (--nproc_per_node); those get the dashed name to use.
std::string unknown_option_error(const std::string& arg, const CLI::App& app) {
  const std::string name = arg.substr(0, arg.find('='));
  std::string error = "unknown option '" + name + "' (before the program name, arguments are ringrun's options)";
  std::string dashed = name;
  for (size_t i = 2; i < dashed.size(); ++i) {
    if (dashed[i] == '_') dashed[i] = '-';
  }
  if (dashed != name && dashed.rfind("--", 0) == 0) {
    for (const CLI::Option* option : app.get_options()) {
      if (option->check_lname(dashed.substr(2))) return error + "; did you mean " + dashed + "?";
    }
  }
  return error + "; to pass it to the program, put -- before the program: ringrun [options] -- program " + arg;
}

// The guardian: a child of ringrun forked before the workers, so that what they
// started does not outlive a ringrun killed outright (kill -9, the OOM killer), which
// cleans up nothing. The workers themselves die then (PR_SET_PDEATHSIG), but not what
// they started: a worker that is `bash train.sh` runs its program as a child. ringrun
// tells the guardian, over a socket only the two hold, each worker's process group
// ("+<pgid>"), each group found empty ("-<pgid>": its number may be reused), and
// "done" when it ends having cleaned up. End of file without "done" means ringrun
// died: the guardian sends SIGKILL to the groups that may still have members, and
// exits. It keeps ringrun's blocked signals blocked (a Ctrl-C to ringrun's process
// group, a scancel, does nothing to it) and holds neither stdin nor stdout.
[[noreturn]] void run_guardian(int fd, pid_t ringrun_pid) {
  std::vector<pid_t> groups;
  std::string pending;
  bool done = false;
  char buffer[512];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    for (size_t end; (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1)) {
      const std::string line = pending.substr(0, end);
      if (line == "done") {
        done = true;
      } else if (line.size() > 1 && (line[0] == '+' || line[0] == '-')) {
        const pid_t pgid = static_cast<pid_t>(std::atol(line.c_str() + 1));
        if (pgid <= 1) continue;
        if (line[0] == '+') groups.push_back(pgid);
        else groups.erase(std::remove(groups.begin(), groups.end(), pgid), groups.end());
      }
    }
  }
  if (!done) {
    std::string killed;
    for (pid_t pgid : groups) {
      if (kill(-pgid, SIGKILL) == 0) killed += " " + std::to_string(pgid);
    }
    if (!killed.empty()) {
      std::fprintf(stderr, "ringrun: ringrun (pid %d) died without stopping its workers; killed what was left "
                   "in their process groups:%s\n", static_cast<int>(ringrun_pid), killed.c_str());
    }
  }
  _exit(0);
}

// Sends the guardian one line; never raises SIGPIPE (a guardian gone must not kill ringrun).
void tell_guardian(int fd, const std::string& line) {
  if (fd < 0) return;
  const std::string message = line + "\n";
  (void)::send(fd, message.data(), message.size(), MSG_NOSIGNAL);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringrun: launch and supervise the worker processes of a ringtrain job (env:// init)"};
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string job_token;
  double stop_timeout = 10.0;
  double signal_timeout = 30.0;
  app.add_option("--nproc-per-node", nproc_per_node, "worker processes on this node")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--nnodes", nnodes, "nodes in the job")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--node-rank", node_rank, "this node's index, 0 .. nnodes-1")
      ->check(CLI::Range(0, 99999))->capture_default_str();
  CLI::Option* master_addr_option =
      app.add_option("--master-addr", master_addr,
                     "host of rank 0 (the store); required with --nnodes above 1, where the default, "
                     "loopback, would have every node look for the store on itself")
          ->capture_default_str();
  app.add_option("--master-port", master_port, "TCP port of the store on the master")
      ->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--job-token", job_token,
                 "token every rank presents to the store (default: random on one node; on several, "
                 "derived by env:// from the master port and world size; RINGTRAIN_JOB_TOKEN also works)");
  app.add_option("--stop-timeout", stop_timeout,
                 "seconds between SIGTERM and SIGKILL when stopping the other workers after a failure, "
                 "or what the workers left running after they exited")
      ->check(CLI::Range(0.0, 86400.0))->capture_default_str();
  app.add_option("--signal-timeout", signal_timeout,
                 "seconds between a SIGINT/SIGTERM/SIGHUP/SIGQUIT from outside (forwarded to the workers) "
                 "and SIGKILL: time for them to write a checkpoint (SLURM's default KillWait is 30)")
      ->check(CLI::Range(0.0, 86400.0))->capture_default_str();
  app.prefix_command();  // everything from the program name on belongs to the worker
  app.footer("Usage: ringrun [options] [--] program args... (after the program name, or after --, options "
             "belong to the program)\n"
             "Standard input: rank 0 reads ringrun's standard input when it is a pipe or a file; every other "
             "rank, and rank 0 when it is a terminal, reads /dev/null (as under mpirun: a worker runs in its own "
             "process group and would be stopped by SIGTTIN at its first read of the terminal; one stopped by "
             "SIGTTIN or SIGTTOU anyway counts as failed).\n"
             "When the workers exit, or one fails, whatever they left running in their process groups gets "
             "SIGTERM, then SIGKILL after --stop-timeout.\n"
             "Exit status: 0 when every worker exited 0; else the first failed worker's (its exit code, or 128 + "
             "its signal); after a SIGINT/SIGTERM/SIGHUP/SIGQUIT from outside, forwarded while workers ran, "
             "ringrun dies of that signal once they are gone (a shell shows 128 + the signal; a script stops on "
             "Ctrl-C); 2 for a usage error.\n"
             "Example: ringrun --nproc-per-node 2 ./build/bench/comm_sweep --backend ring");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); its own codes (105 for a value out of
    // range, 114 for an option given twice, ...) are not what the help promises.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // --help is no error
  }

  std::vector<std::string> command = app.remaining();
  if (!command.empty() && command.front() == "--") {
    command.erase(command.begin());  // "ringrun [options] -- program ...": whatever follows is the program
  } else if (!command.empty() && command.front().size() > 1 && command.front().front() == '-') {
    // CLI11 hands the first argument it does not know to the worker; before the program
    // name that is a mistyped option (torchrun's --nproc_per_node), not a program.
    std::string error = unknown_option_error(command.front(), app);
    std::cerr << "ringrun: " << error << "\nRun with --help for more information.\n";
    return 2;
  }
  if (command.empty()) {
    std::cerr << "ringrun: no program given\n" << app.help();
    return 2;
  }
  if (node_rank >= nnodes) {
    std::cerr << "ringrun: --node-rank " << node_rank << " must be below --nnodes " << nnodes << "\n";
    return 2;
  }
  if (master_addr.empty()) {
    std::cerr << "ringrun: --master-addr is empty; give the host name or address of node 0 (where rank 0 "
                 "and the store run), or leave it out on one node\n";
    return 2;
  }
  if (nnodes > 1 && master_addr_option->count() == 0) {
    std::cerr << "ringrun: --nnodes " << nnodes << " needs --master-addr: the address of node 0 (where rank 0 "
                 "and the store run) that every node can reach, the same on every node; the default, "
              << master_addr << ", would have each node look for the store on itself\n";
    return 2;
  }
  if (node_rank == 0 && !port_is_free(master_port)) {
    std::cerr << "ringrun: --master-port " << master_port
              << " is already in use on this host (another job, or a previous run still exiting); "
                 "pick a free port with --master-port\n";
    return 2;
  }
  if (job_token.empty()) {
    if (const char* env = std::getenv("RINGTRAIN_JOB_TOKEN"); env && *env) job_token = env;
    else if (nnodes == 1) job_token = random_token();
    // Several nodes: every node must present the same token, and a random one cannot be
    // shared. Left unset, env:// derives one from the master port and world size (not
    // from the master's address, which the nodes may spell differently).
  }
  const int world_size = nnodes * nproc_per_node;

  // An ignored SIGCHLD survives exec: started so (by a daemon, a Python program that set
  // it), ringrun's children would be reaped by the kernel itself, waitpid() would never
  // report them, and ringrun would wait forever. The default it is, for the workers too.
  signal(SIGCHLD, SIG_DFL);

  // Signals are handled synchronously (sigtimedwait below): block them now, and
  // unblock them in each child before exec.
  // A signal ringrun was started with ignored stays ignored, as nohup (SIGHUP) and a
  // shell's background jobs (SIGINT, SIGQUIT) expect: not collected, so not forwarded
  // (the workers inherit the ignore anyway) and no stop. Blocked, it would be collected
  // all the same: the kernel discards an ignored signal only while it is not blocked.
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) {
    struct sigaction inherited {};
    if (sigaction(sig, nullptr, &inherited) == 0 && inherited.sa_handler == SIG_IGN) continue;
    sigaddset(&handled, sig);
  }
  sigaddset(&handled, SIGCHLD);
  sigset_t previous;
  sigprocmask(SIG_BLOCK, &handled, &previous);

  // What a worker leaves behind when its parent dies (a shell's background job, a
  // daemonized helper) is reparented to ringrun rather than to init, so that ringrun
  // reaps it: the waitpid(-1) below collects those too.
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  // The workers are not in the terminal's foreground process group: one that reads the
  // terminal would be stopped by SIGTTIN. Like mpirun: only rank 0 reads ringrun's
  // stdin, and only when it is not a terminal (a pipe, a file); the others read /dev/null
  // (rank 0 too when ringrun's stdin is closed: a worker's first open() would get fd 0).
  const bool rank0_keeps_stdin = fcntl(STDIN_FILENO, F_GETFD) != -1 && isatty(STDIN_FILENO) != 1;
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull >= 0 && devnull <= STDERR_FILENO) {
    // fd 0-2 were closed: keep it there (a closed standard fd would be reused) and use a
    // copy above them, so that dup2 onto fd 0 in a worker really clears close-on-exec.
    devnull = fcntl(devnull, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  }
  if (devnull < 0) {
    std::cerr << "ringrun: cannot open /dev/null: " << std::strerror(errno) << "\n";
    return 1;
  }

  const pid_t ringrun_pid = getpid();
  // The guardian (see run_guardian): forked before the workers, with the signals above
  // blocked. Without it (no socket, no fork) the job runs all the same, unguarded.
  int guardian_fd = -1;
  if (int ends[2]; ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) == 0) {
    const pid_t guardian = fork();
    if (guardian == 0) {
      ::close(ends[0]);
      dup2(devnull, STDIN_FILENO);
      dup2(devnull, STDOUT_FILENO);
      run_guardian(ends[1], ringrun_pid);
    }
    ::close(ends[1]);
    if (guardian > 0) guardian_fd = ends[0];
    else ::close(ends[0]);
  }

  std::vector<Worker> workers(nproc_per_node);
  for (int local = 0; local < nproc_per_node; ++local) {
    const int rank = node_rank * nproc_per_node + local;
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("ringrun: fork");
      for (auto& w : workers) if (w.running) kill(-w.pgid, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      setpgid(0, 0);
      // If ringrun itself is killed (kill -9, OOM killer), nothing forwards signals
      // any more: the kernel kills the worker then. ringrun may already have died
      // before this call, so look whether the parent is still ringrun.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != ringrun_pid) _exit(128 + SIGKILL);
      if (rank != 0 || !rank0_keeps_stdin) dup2(devnull, STDIN_FILENO);
      sigprocmask(SIG_SETMASK, &previous, nullptr);
      setenv("MASTER_ADDR", master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc_per_node).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
      setenv("NODE_RANK", std::to_string(node_rank).c_str(), 1);
      if (!job_token.empty()) setenv("RINGTRAIN_JOB_TOKEN", job_token.c_str(), 1);
      std::vector<char*> args;
      for (auto& part : command) args.push_back(part.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "ringrun: cannot run '%s': %s\n", args[0], std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);  // also here: no race with the child's own setpgid
    workers[local] = {pid, rank, true, pid, true};
    tell_guardian(guardian_fd, "+" + std::to_string(pid));
  }
  ::close(devnull);

  using Clock = std::chrono::steady_clock;
  auto after = [](double seconds) {
    return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  };
  int running = nproc_per_node;
  int exit_code = 0;
  bool stopping = false;   // TERM (or a stop signal) has gone to every group; SIGKILL at kill_deadline
  auto kill_deadline = Clock::time_point::max();
  bool killed = false;     // SIGKILL has gone to every group
  int stopped_by = 0;      // the stop signal from outside that decided the exit status, if one did
  Clock::time_point killed_at;
  // Each worker leads its own process group: signal the group, so that whatever the
  // worker started (a shell's children, data-loader processes) gets it too. The group
  // outlives a worker that exits while its children still run, so every group that
  // still has members is signalled, whether its worker is running or not (only those:
  // a group found empty is never signalled again, its number may be reused).
  auto group_has_members = [&](Worker& w) {
    if (w.group_live && kill(-w.pgid, 0) != 0 && errno == ESRCH) {
      w.group_live = false;
      tell_guardian(guardian_fd, "-" + std::to_string(w.pgid));
    }
    return w.group_live;
  };
  auto signal_groups = [&](int sig, bool running_workers_only) {
    for (auto& w : workers) {
      if (running_workers_only && !w.running) continue;
      if (group_has_members(w)) kill(-w.pgid, sig);
    }
  };
  // SIGTERM, and SIGCONT after it, so that a stopped process acts on it.
  auto stop_groups = [&](double timeout) {
    signal_groups(SIGTERM, false);
    signal_groups(SIGCONT, false);
    stopping = true;
    kill_deadline = after(timeout);
  };
  auto live_groups = [&] {
    std::string ranks;
    for (auto& w : workers) {
      if (group_has_members(w)) ranks += (ranks.empty() ? "" : " ") + std::to_string(w.rank);
    }
    return ranks;
  };
  while (true) {
    const std::string leftovers = running > 0 ? std::string() : live_groups();
    if (running == 0) {
      if (leftovers.empty()) break;
      if (killed && Clock::now() >= killed_at + std::chrono::seconds(5)) {
        std::cerr << "ringrun: processes in the process groups of rank(s) " << leftovers
                  << " still exist 5 s after SIGKILL; exiting without them\n";
        break;
      }
      if (!stopping) {
        // The workers have all exited; what they left running in their process groups
        // goes too, as under torchrun and mpirun.
        std::cerr << "ringrun: the workers have exited; stopping the processes they left running "
                     "(process groups of rank(s) " << leftovers << ")\n";
        stop_groups(stop_timeout);
      }
    }
    timespec tick{0, 100 * 1000 * 1000};
    int sig = sigtimedwait(&handled, nullptr, &tick);
    if (sig > 0 && sig != SIGCHLD) {
      // forward: the workers decide what the signal means (checkpoint, requeue, stop)
      const bool stop_signal = sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
      // A stop signal goes to every group, leftovers of exited workers included, since
      // ringrun is ending; SIGUSR1/2 only to the running workers'.
      signal_groups(sig, !stop_signal);
      if (stop_signal) {
        signal_groups(SIGCONT, false);  // a stopped process acts on it only once continued (as scancel does)
        if (!stopping) kill_deadline = after(signal_timeout);
        stopping = true;
        if (exit_code == 0 && running > 0) {
          exit_code = 128 + sig;
          stopped_by = sig;
        }
      }
    }
    int status = 0;
    pid_t pid;
    // WUNTRACED: a stopped worker is reported too. Pids that are no worker's are what
    // the workers left behind, reparented to ringrun (the subreaper): reaped, nothing more.
    while ((pid = waitpid(-1, &status, WNOHANG | WUNTRACED)) > 0) {
      if (!WIFSTOPPED(status)) {
        if (const int removed = remove_shm_leftovers(pid); removed > 0) {
          std::string who = "process " + std::to_string(pid);
          for (auto& w : workers) {
            if (w.pid == pid) who = "worker rank " + std::to_string(w.rank) + " (pid " + std::to_string(pid) + ")";
          }
          std::cerr << "ringrun: removed " << removed << " shared memory segment(s) that " << who
                    << " left in /dev/shm (it " << describe_status(status) << ")\n";
        }
      }
      for (auto& w : workers) {
        if (w.pid != pid || !w.running) continue;
        if (WIFSTOPPED(status)) {
          const int stop_sig = WSTOPSIG(status);
          if (stop_sig != SIGTTIN && stop_sig != SIGTTOU) {
            // SIGSTOP or SIGTSTP from someone (kill -STOP, a debugger): deliberate, so wait.
            std::cerr << "ringrun: worker rank " << w.rank << " (pid " << pid << ") was stopped by signal "
                      << stop_sig << " (" << strsignal(stop_sig) << "); waiting until it is continued "
                      << "(kill -CONT -" << w.pgid << ")\n";
            continue;
          }
          // It tried to use the terminal, which only the foreground process group (ringrun's)
          // may: it would stay stopped forever.
          std::cerr << "ringrun: worker rank " << w.rank << " (pid " << pid << ") was stopped by signal "
                    << stop_sig << " (" << strsignal(stop_sig) << "): it tried to "
                    << (stop_sig == SIGTTIN ? "read from" : "write to or configure")
                    << " the terminal, which workers cannot (they run in their own process groups; "
                       "give input through a file or a pipe)";
          if (!stopping) {
            std::cerr << "; counting it as failed and stopping the workers\n";
            exit_code = 128 + stop_sig;
            stop_groups(stop_timeout);
          } else {
            std::cerr << "\n";
          }
          continue;
        }
        w.running = false;
        --running;
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping) {
          std::cerr << "ringrun: worker rank " << w.rank << " (pid " << pid << ") "
                    << describe_status(status) << "; stopping the other workers\n";
          exit_code = status_to_exit_code(status);
          stop_groups(stop_timeout);  // its own group too: what it started may outlive it
        }
      }
    }
    // A worker that exited while others run: once its group is empty, say so (to the
    // guardian too), so that its number, free for reuse by then, is never signalled.
    for (auto& w : workers)
      if (!w.running) group_has_members(w);
    const std::string left = stopping && !killed && running == 0 ? live_groups() : std::string();
    if (stopping && !killed && (running > 0 || !left.empty()) && Clock::now() >= kill_deadline) {
      if (running > 0) {
        std::cerr << "ringrun: " << running << " worker(s) still running after the stop timeout";
      } else {
        std::cerr << "ringrun: processes the workers started (process groups of rank(s) " << left
                  << ") still running after the stop timeout";
      }
      std::cerr << " (--stop-timeout " << stop_timeout << " s after a worker failed or the workers exited, "
                << "--signal-timeout " << signal_timeout << " s after a stop signal); sending SIGKILL\n";
      signal_groups(SIGKILL, false);
      killed = true;
      killed_at = Clock::now();
    }
  }
  tell_guardian(guardian_fd, "done");  // it exits at end of file, when ringrun does
  if (stopped_by != 0 && exit_code == 128 + stopped_by) {
    // The job ended because of this signal: die of it, as a shell's child would, so
    // that a calling script stops too (see Exit status at the top of the file).
    std::cout.flush();
    std::cerr.flush();
    if (stopped_by == SIGQUIT) {
      rlimit no_core{0, 0};
      setrlimit(RLIMIT_CORE, &no_core);  // SIGQUIT's default action dumps core
    }
    signal(stopped_by, SIG_DFL);
    sigset_t just_it;
    sigemptyset(&just_it);
    sigaddset(&just_it, stopped_by);
    raise(stopped_by);  // pending while blocked; delivered, and fatal, on unblocking
    sigprocmask(SIG_UNBLOCK, &just_it, nullptr);
  }
  return exit_code;
}
