// grid_submit.cc: ringtrain-grid, a hyperparameter grid search on SLURM.
//
//   ringtrain-grid --param lr=0.1,0.01 --param batch-size=16,32 --dry-run
//   ringtrain-grid --config grid.json --output-root runs/sweep1
//
// Every combination of the parameters becomes one sbatch script in its own
// directory under --output-root (the job's log and checkpoints land there too);
// --dry-run prints the scripts and touches nothing, otherwise each is submitted
// with sbatch ($RINGTRAIN_SBATCH overrides the path) and the job ids are printed
// and recorded in <output-root>/grid.json. Flags given on the command line
// override the config file; --param adds parameters after the file's.
// The work is done by slurm/grid_search.h; this file is the command line.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "slurm/grid_search.h"
#include "slurm/subprocess.h"

int main(int argc, char** argv) {
  using namespace ringtrain::slurm;
  CLI::App app{"ringtrain-grid: submit one SLURM job per hyperparameter combination (cartesian product)"};
  std::string config_path, template_path, output_root, job_name, command, time;
  std::vector<std::string> params, sbatch_extra;
  int nodes = 0, ntasks_per_node = 0;
  bool dry_run = false;
  app.add_option("--config", config_path, "JSON grid config (job_name, output_root, command, nodes, "
                 "ntasks_per_node, time, sbatch, template, params)")->check(CLI::ExistingFile);
  app.add_option("--param", params, "name=v1,v2,... (repeatable): one grid axis, passed as --name value");
  app.add_option("--template", template_path, "sbatch template with {{placeholders}} (default: built in)")
      ->check(CLI::ExistingFile);
  app.add_option("--output-root", output_root, "where the per-run directories go (default grid_runs)");
  app.add_option("--job-name", job_name, "job name prefix (default ringtrain-grid)");
  app.add_option("--command", command, "the program each run starts with srun "
                 "(default: ${RINGTRAIN_BUILD:-build}/examples/digits_ddp --strategy ddp --epochs 20 --num-nodes {{nodes}}); "
                 "{{placeholders}} are filled in as in the template");
  app.add_option("--nodes", nodes, "nodes per run")->check(CLI::PositiveNumber);
  app.add_option("--ntasks-per-node", ntasks_per_node, "tasks (ranks) per node, one per GPU")
      ->check(CLI::PositiveNumber);
  app.add_option("--time", time, "walltime per run, e.g. 01:00:00");
  app.add_option("--sbatch", sbatch_extra, "extra #SBATCH option (repeatable), e.g. --sbatch=--gres=gpu:2");
  app.add_flag("--dry-run", dry_run, "print the scripts; write and submit nothing");
  CLI11_PARSE(app, argc, argv);

  try {
    GridSpec spec;
    if (!config_path.empty()) {
      std::ifstream in(config_path);
      std::stringstream text;
      text << in.rdbuf();
      load_grid_config(text.str(), std::filesystem::path(config_path).parent_path().string(), &spec);
    }
    if (!template_path.empty()) {
      std::ifstream in(template_path);
      std::stringstream text;
      text << in.rdbuf();
      spec.template_text = text.str();
    }
    if (!output_root.empty()) spec.output_root = output_root;
    if (!job_name.empty()) spec.job_name = job_name;
    if (!command.empty()) spec.command = command;
    if (nodes > 0) spec.nodes = nodes;
    if (ntasks_per_node > 0) spec.ntasks_per_node = ntasks_per_node;
    if (!time.empty()) spec.time = time;
    for (const std::string& line : sbatch_extra) spec.sbatch_extra.push_back(line);
    for (const std::string& flag : params) spec.params.push_back(parse_param_flag(flag));

    std::vector<GridRun> runs = plan_grid(spec);
    if (dry_run) {
      std::cout << format_dry_run(runs);
      return 0;
    }
    std::vector<SubmittedRun> submitted = submit_grid(runs, spec, ringtrain::comm::current_environment());
    for (const SubmittedRun& s : submitted) {
      std::cout << "job " << s.job_id << "  " << s.run.dir << "\n";
    }
    std::cout << "submitted " << submitted.size() << " job" << (submitted.size() == 1 ? "" : "s")
              << "; record: " << (std::filesystem::path(runs.front().dir).parent_path() / "grid.json").string()
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ringtrain-grid: " << e.what() << "\n";
    return 1;
  }
}
