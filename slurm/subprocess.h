// subprocess.h: running a helper program (scontrol, sbatch) and capturing what it says.
//
// defines: SlurmError (every failure of the slurm library), ProcessResult,
//          run_process (posix_spawnp + a pipe, with a timeout), find_program.
//
// The SLURM tools are separate programs, so talking to SLURM means starting one
// and reading its output. run_process does that without a shell (no quoting
// bugs, no injection through job names): argv goes to posix_spawnp as is,
// stdout and stderr share one pipe (the order the tool wrote them in is kept),
// and the child is owned by an RAII guard that kills and reaps it if anything
// throws on the way, so no zombie or stray scontrol outlives the call.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tensor/checks.h"

namespace ringtrain::slurm {

// Any failure of the slurm library: bad environment, a tool missing or failing.
class SlurmError : public Error {
 public:
  using Error::Error;
};

// run_process: the program ran but did not finish in time (it was killed). Callers tell
// this apart from a program that could not be started, whose fix is to install it.
class ProcessTimeoutError : public SlurmError {
 public:
  using SlurmError::SlurmError;
};

// run_process: the program is not there (not in PATH, or no executable at the path).
class ProgramNotFoundError : public SlurmError {
 public:
  using SlurmError::SlurmError;
};

struct ProcessResult {
  int exit_code = -1;   // the child's exit status; 128+N when killed by signal N
  std::string output;   // stdout and stderr, interleaved as written
};

// Runs argv[0] (looked up in PATH when it has no '/') with the other entries as its
// arguments, waits at most `timeout` (then kills it and throws ProcessTimeoutError).
// Throws SlurmError when the program cannot be started (its name and the reason: "not
// found in PATH", ...).
// A non-zero exit is not an error here: the caller decides (see exit_code).
// SIGUSR1, SIGUSR2 and SIGTERM are blocked in the child (SLURM's warning signals reach
// every process of a job step: a helper mid-request finishes it).
ProcessResult run_process(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

// The path run_process would execute for `name`, or "" when it is not found
// (absolute or relative paths are returned as they are when executable).
std::string find_program(const std::string& name);

}  // namespace ringtrain::slurm
