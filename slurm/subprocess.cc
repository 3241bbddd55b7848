// subprocess.cc: posix_spawnp with one pipe, read with poll() until EOF or the
// deadline, then waitpid. Two RAII guards own the handles: Fd (a pipe end) and
// Child (a spawned pid: killed with SIGKILL and reaped if still running when the
// guard dies, e.g. on a timeout or an exception while reading).
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
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
  }

 private:
  pid_t pid_;
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
    throw SlurmError(program.find('/') != std::string::npos
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
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, program.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw SlurmError("cannot run '" + program + "': " + std::strerror(rc));
  }
  Child child(pid);
  write_end.reset();  // only the child writes; EOF comes when it exits

  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      throw SlurmError("'" + program + "' did not finish within " + std::to_string(timeout.count()) +
                       " ms (killed); output so far: " + result.output);
    }
    pollfd pfd{read_end.get(), POLLIN, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
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
    if (n == 0) break;  // EOF: the child closed its end (exited)
    result.output.append(buffer, static_cast<size_t>(n));
  }
  result.exit_code = child.wait();
  return result;
}

}  // namespace ringtrain::slurm
