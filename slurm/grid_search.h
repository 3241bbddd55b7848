// grid_search.h: a hyperparameter grid -> one sbatch script per combination.
//
// defines: GridParam, GridSpec, GridRun, parse_param_flag, load_grid_config,
//          cartesian_product, render_template, plan_grid, format_dry_run,
//          parse_submitted_job_id, SubmittedRun, submit_grid, kDefaultGridTemplate.
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
// option is an error too: it would split the script into extra shell lines.
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
};

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
// Quotes `text` for bash when it holds anything but [A-Za-z0-9_./:=+-@%,].
std::string shell_quote(const std::string& text);
// All runs of the grid, rendered. Validates the spec (names, duplicates, sizes,
// no control characters).
std::vector<GridRun> plan_grid(const GridSpec& spec);
// What --dry-run prints: each script under a "==> path <==" header.
std::string format_dry_run(const std::vector<GridRun>& runs);
// "Submitted batch job 123" (optionally "... on cluster x") -> "123"; nullopt otherwise.
std::optional<std::string> parse_submitted_job_id(const std::string& sbatch_output);

struct SubmittedRun {
  GridRun run;
  std::string job_id;
};
// Writes every run's directory and script, submits each with sbatch ($RINGTRAIN_SBATCH
// or "sbatch" from PATH), and writes output_root/grid.json (runs, values, job ids).
// Throws SlurmError when sbatch fails or prints no job id (runs submitted before the
// failure are named in the message so they can be cancelled).
std::vector<SubmittedRun> submit_grid(const std::vector<GridRun>& runs, const GridSpec& spec,
                                      const comm::EnvMap& env);

}  // namespace ringtrain::slurm
