// outside_slurm.h: tests that simulate the walltime signal must not act on a real
// SLURM job. Run inside `sbatch` or `salloc`, the process inherits SLURM_JOB_ID and
// friends, and a simulated signal would `scontrol requeue` the very job running the
// tests. Including this header removes every SLURM_* variable at start-up (before
// main), so such a test sees what it would see on a workstation; a test that wants a
// SLURM job sets the variables it needs itself (and a fake scontrol through
// RINGTRAIN_SCONTROL).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;

namespace ringtrain::testing {

inline const bool kLeftTheSlurmJobEnvironment = [] {
  std::vector<std::string> names;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    if (text.rfind("SLURM_", 0) == 0) names.push_back(text.substr(0, text.find('=')));
  }
  for (const auto& name : names) ::unsetenv(name.c_str());
  return true;
}();

}  // namespace ringtrain::testing
