// grid_search.h: a hyperparameter grid -> one sbatch script per combination.
//
// defines: GridParam, GridSpec, GridRun, parse_param_flag, load_grid_config,
//          cartesian_product, render_template, is_slurm_time, plan_grid,
//          existing_grid_paths, describe_existing_grid, format_dry_run,
//          parse_submitted_job_id, SubmittedRun, submit_grid, kDefaultGridTemplate,
//          kMaxGridNodes, kMaxGridTasksPerNode, kSlurmTimeFormats.
//
// What Lightning's seeds call SlurmCluster / the test-tube grid search: the user
// lists values per hyperparameter, every combination becomes its own SLURM job with
// its own directory (log, checkpoints, the script itself), and the ids that sbatch
// returns are reported. This file is the library half (pure functions + the submit
// loop) so that tests can check the exact scripts; slurm/tools/grid_submit.cc is
// the ringtrain-grid command line around it.
//
// Config file (JSON; keys in file order are the loop order, the first slowest):
//   {
//     "job_name": "digits-grid",
//     "output_root": "runs/digits-grid",          // run directories go under here
//     "command": "build/examples/digits_ddp --strategy ddp --epochs 20 --num-nodes 2",
//     "nodes": 2, "ntasks_per_node": 1, "time": "00:30:00",
//     "sbatch": ["--partition=debug", "--gres=gpu:1"],   // extra #SBATCH lines
//     "template": "path/to/my.sbatch.in",         // optional; default kDefaultGridTemplate
//     "params": { "lr": [0.1, 0.01], "batch-size": [16, 32] }
//   }
// Template placeholders: {{name}} for each parameter (its value shell-quoted), and {{job_name}},
// {{run_name}}, {{run_index}}, {{run_count}}, {{run_dir}}, {{run_values}},
// {{nodes}}, {{ntasks_per_node}}, {{time}}, {{sbatch_extra}}, {{command}},
// {{args}} (every parameter as "--name value", shell-quoted), {{submit_dir}}.
// An unknown placeholder is an error (a typo would otherwise reach sbatch). A control
// character (newline, tab, ...) in a value, the command, time, output root or an sbatch
// option is an error too: it would split the script into extra shell lines. "nodes" and
// "ntasks_per_node" must be whole numbers (2.7 is refused, not truncated), "time" one of
// SLURM's walltime formats.
//
// An output root that already holds a grid (its grid.json, or a run directory this grid
// would write) is refused: submitting again would replace the record of the earlier
// job ids, rewrite the runs' job.sbatch, and make the new runs resume from the old
// runs' checkpoints. GridSpec::overwrite (ringtrain-grid --overwrite) submits anyway,
// on purpose: job.sbatch files are rewritten, the earlier grid.json is kept as
// grid.json.1 (.2, ...), and nothing is deleted (checkpoints and logs stay; a run whose
// checkpoints/ holds some resumes from them).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/launch_env.h"

namespace ringtrain::slurm {

struct GridParam {
  std::string name;                 // becomes --name in {{args}} and {{name}} in templates
  std::vector<std::string> values;  // as text, in the order given
};

struct GridSpec {
  std::string job_name = "ringtrain-grid";
  std::string output_root = "grid_runs";  // made absolute by plan_grid
  std::string command = "${RINGTRAIN_BUILD:-build}/examples/digits_ddp --strategy ddp --epochs 20 --num-nodes {{nodes}}";
  int nodes = 1;
  int ntasks_per_node = 1;
  std::string time = "01:00:00";
  std::vector<std::string> sbatch_extra;  // "--partition=debug" -> "#SBATCH --partition=debug"
  std::string template_text;              // empty: kDefaultGridTemplate
  std::string submit_dir;                 // empty: the current directory
  std::vector<GridParam> params;
  bool overwrite = false;                 // submit into an output root that holds a grid
};

// Bounds of "nodes" and "ntasks_per_node" (the same as ringrun's --nnodes, --nproc-per-node).
inline constexpr int kMaxGridNodes = 100000;
inline constexpr int kMaxGridTasksPerNode = 4096;
// The walltime spellings is_slurm_time accepts, for error messages.
extern const char* const kSlurmTimeFormats;

// One combination, ready to write and submit.
struct GridRun {
  int index = 0;                                            // 0-based position in the grid
  std::vector<std::pair<std::string, std::string>> values;  // (param, value), param order
  std::string name;         // "003_lr-0.01_batch-size-32": directory name
  std::string dir;          // output_root/name (absolute)
  std::string script_path;  // dir/job.sbatch
  std::string script;       // the rendered script text
};

extern const char* const kDefaultGridTemplate;

// "lr=0.1,0.01" -> {lr, [0.1, 0.01]}. Throws SlurmError naming the flag when malformed.
GridParam parse_param_flag(const std::string& flag);
// Reads the JSON config (format above) into `spec`, overriding what the file sets.
// `base_dir` resolves a relative "template" path. Throws SlurmError on bad JSON or keys.
void load_grid_config(const std::string& json_text, const std::string& base_dir, GridSpec* spec);
// Every combination, first parameter varying slowest. No params: one empty combination.
std::vector<std::vector<std::pair<std::string, std::string>>> cartesian_product(
    const std::vector<GridParam>& params);
// Replaces {{key}} by vars[key]; throws on an unknown or unclosed placeholder.
std::string render_template(const std::string& text, const std::map<std::string, std::string>& vars);
// True for a walltime sbatch --time accepts: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM,
// D-HH:MM:SS (digits only), or UNLIMITED / INFINITE. False for "" and anything else.
bool is_slurm_time(const std::string& text);
// Quotes `text` for bash when it holds anything but [A-Za-z0-9_./:=+-@%,].
std::string shell_quote(const std::string& text);
// All runs of the grid, rendered. Validates the spec (names, duplicates, sizes,
// no control characters).
std::vector<GridRun> plan_grid(const GridSpec& spec);
// The paths of an earlier grid that submitting `runs` would write over: the output
// root's grid.json and every run directory that exists already. Empty: a fresh root.
std::vector<std::string> existing_grid_paths(const std::vector<GridRun>& runs);
// What is there and what to do about it, for the error and for --dry-run: names the
// paths (the first few), and the fixes (another --output-root, or --overwrite).
std::string describe_existing_grid(const std::vector<std::string>& existing, bool overwrite);
// What --dry-run prints: each script under a "==> path <==" header; then, when
// `existing` is not empty, "# " lines saying what a real submission would collide with.
std::string format_dry_run(const std::vector<GridRun>& runs, const std::vector<std::string>& existing = {},
                           bool overwrite = false);
// "Submitted batch job 123" (optionally "... on cluster x") -> "123"; nullopt otherwise.
std::optional<std::string> parse_submitted_job_id(const std::string& sbatch_output);

struct SubmittedRun {
  GridRun run;
  std::string job_id;
};
// Writes every run's directory and script, submits each with sbatch ($RINGTRAIN_SBATCH
// or "sbatch" from PATH), and writes output_root/grid.json (runs, values, job ids).
// Throws SlurmError, before writing anything, when the output root holds an earlier
// grid (existing_grid_paths) and spec.overwrite is false; with it, an earlier grid.json
// is renamed to grid.json.<n> first. Throws SlurmError when sbatch fails or prints no
// job id (runs submitted before the failure are named in the message so they can be
// cancelled).
std::vector<SubmittedRun> submit_grid(const std::vector<GridRun>& runs, const GridSpec& spec,
                                      const comm::EnvMap& env);

}  // namespace ringtrain::slurm
