// subprocess.cc: posix_spawnp with one pipe, read with poll() until the child has
// exited and its output is drained, or the deadline. Two RAII guards own the
// handles: Fd (a pipe end) and Child (a spawned pid, leader of its own process
// group: the group is killed with SIGKILL and the child reaped if it is still
// running when the guard dies, e.g. on a timeout or an exception while reading).
//
// The end is the child's exit, not EOF on the pipe: a wrapper script that leaves a
// background process behind (which inherits the pipe) would otherwise look like a
// command that never finishes.
#include "slurm/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace ringtrain::slurm {
namespace {

// One file descriptor; closed on destruction. Move-only.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// One spawned child. wait() reaps it and returns its status; if the guard dies
// first, the child is killed and reaped (no zombies, no orphans). Not copyable.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  ~Child() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);  // the whole group: what the command started dies with it
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int wait() {
    int status = 0;
    pid_t got;
    do {
      got = ::waitpid(pid_, &status, 0);
    } while (got < 0 && errno == EINTR);
    if (got < 0) throw SlurmError(std::string("waitpid failed: ") + std::strerror(errno));
    pid_ = -1;
    return decode(status);
  }

  // The exit code if the child has exited (it is then reaped), else -1 without waiting.
  int try_wait() {
    if (pid_ <= 0) return exit_code_;
    int status = 0;
    pid_t got;
    do {
      got = ::waitpid(pid_, &status, WNOHANG);
    } while (got < 0 && errno == EINTR);
    if (got < 0) throw SlurmError(std::string("waitpid failed: ") + std::strerror(errno));
    if (got == 0) return -1;
    pid_ = -1;
    exit_code_ = decode(status);
    return exit_code_;
  }
  bool exited() const { return pid_ <= 0; }

 private:
  static int decode(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
  }

  pid_t pid_;
  int exit_code_ = -1;
};

bool is_executable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string find_program(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t colon = dirs.find(':', pos);
    if (colon == std::string::npos) colon = dirs.size();
    std::string dir = dirs.substr(pos, colon - pos);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (is_executable(candidate)) return candidate;
    pos = colon + 1;
  }
  return "";
}

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  if (argv.empty() || argv[0].empty()) throw SlurmError("run_process: empty command line");
  const std::string& program = argv[0];
  if (find_program(program).empty()) {
    throw ProgramNotFoundError(program.find('/') != std::string::npos
                                   ? "cannot run '" + program + "': no executable file at that path"
                                   : "cannot run '" + program + "': not found in PATH");
  }

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    throw SlurmError(std::string("pipe2 failed: ") + std::strerror(errno));
  }
  Fd read_end(pipe_fds[0]);
  Fd write_end(pipe_fds[1]);

  // The child: stdout and stderr both go into the pipe, stdin reads /dev/null.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), 2);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  // Its own process group, so that a timeout kills what it started too. The signals
  // SLURM sends a job's processes as warnings (the walltime signal, USR1 or USR2, and
  // TERM before the kill) are blocked in it: SLURM signals every process of the step,
  // this child included, and may signal twice (a retried RPC under load); an
  // `scontrol requeue` killed midway by the walltime signal that asked for it lost a
  // job its requeue. SIGKILL, and the timeout below, still end it.
  sigset_t child_mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &child_mask);
  for (int signal : {SIGUSR1, SIGUSR2, SIGTERM}) sigaddset(&child_mask, signal);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setsigmask(&attributes, &child_mask);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, program.c_str(), &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) {
    throw SlurmError("cannot run '" + program + "': " + std::strerror(rc));
  }
  Child child(pid);
  write_end.reset();  // only the child writes; EOF comes when it exits

  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Once the child has exited, what is still in the pipe is read for at most this long:
  // a process it left behind may hold the pipe open indefinitely.
  constexpr auto kDrainAfterExit = std::chrono::milliseconds(200);
  std::chrono::steady_clock::time_point drain_until{};
  char buffer[4096];
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    if (child.try_wait() >= 0 || child.exited()) {
      if (drain_until == std::chrono::steady_clock::time_point{}) drain_until = now + kDrainAfterExit;
      if (now >= drain_until) break;
    } else if (now >= deadline) {
      throw ProcessTimeoutError("'" + program + "' did not finish within " + std::to_string(timeout.count()) +
                                " ms (killed); output so far: " + result.output);
    }
    const auto until = child.exited() ? drain_until : deadline;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
    pollfd pfd{read_end.get(), POLLIN, 0};
    // Short slices while the child runs, so its exit is noticed promptly.
    int ready = ::poll(&pfd, 1, static_cast<int>(std::clamp<long long>(left.count(), 0, 50)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw SlurmError(std::string("poll failed: ") + std::strerror(errno));
    }
    if (ready == 0) continue;
    ssize_t n = ::read(read_end.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SlurmError(std::string("read from '" + program + "' failed: ") + std::strerror(errno));
    }
    if (n == 0) {
      // EOF: every writer is gone, but the child may still run (it closed its output and
      // hangs on an unreachable slurmctld, say): the deadline still holds.
      while (child.try_wait() < 0 && !child.exited()) {
        if (std::chrono::steady_clock::now() >= deadline) {
          throw ProcessTimeoutError("'" + program + "' did not finish within " + std::to_string(timeout.count()) +
                                    " ms (it closed its output; killed); output: " + result.output);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      break;
    }
    result.output.append(buffer, static_cast<size_t>(n));
  }
  result.exit_code = child.exited() ? child.try_wait() : child.wait();
  return result;
}

}  // namespace ringtrain::slurm
