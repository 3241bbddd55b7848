// grid_submit.cc: ringtrain-grid, a hyperparameter grid search on SLURM.
//
//   ringtrain-grid --param lr=0.1,0.01 --param batch-size=16,32 --dry-run
//   ringtrain-grid --config grid.json --output-root runs/sweep1
//
// Every combination of the parameters becomes one sbatch script in its own
// directory under --output-root (the job's log and checkpoints land there too);
// --dry-run prints the scripts and touches nothing, otherwise each is submitted
// with sbatch ($RINGTRAIN_SBATCH overrides the path) and the job ids are printed
// and recorded in <output-root>/grid.json. An --output-root that already holds a
// grid (grid.json or one of these run directories) is refused unless --overwrite is
// given; --dry-run says what would collide. Flags given on the command line
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
  const GridSpec defaults;
  std::string config_path, template_path, output_root = defaults.output_root, job_name = defaults.job_name,
                                          command = defaults.command, time = defaults.time;
  std::vector<std::string> params, sbatch_extra;
  int nodes = defaults.nodes, ntasks_per_node = defaults.ntasks_per_node;
  bool dry_run = false, overwrite = false;
  // The defaults shown are GridSpec's; a value from --config replaces them, a flag given
  // here replaces both (so each option is applied only when it was given).
  app.add_option("--config", config_path, "JSON grid config (job_name, output_root, command, nodes, "
                 "ntasks_per_node, time, sbatch, template, params)")->check(CLI::ExistingFile);
  app.add_option("--param", params, "name=v1,v2,... (repeatable): one grid axis, passed as --name value");
  app.add_option("--template", template_path, "sbatch template with {{placeholders}} (default: built in)")
      ->check(CLI::ExistingFile);
  CLI::Option* output_root_opt =
      app.add_option("--output-root", output_root, "where the per-run directories and grid.json go; "
                     "must not hold an earlier grid (see --overwrite)")->capture_default_str();
  CLI::Option* job_name_opt = app.add_option("--job-name", job_name, "job name prefix")->capture_default_str();
  CLI::Option* command_opt =
      app.add_option("--command", command, "the program each run starts with srun; "
                     "{{placeholders}} are filled in as in the template")->capture_default_str();
  CLI::Option* nodes_opt = app.add_option("--nodes", nodes, "nodes per run")
                               ->check(CLI::Range(1, kMaxGridNodes))->capture_default_str();
  CLI::Option* ntasks_opt = app.add_option("--ntasks-per-node", ntasks_per_node, "tasks (ranks) per node, one per GPU")
                                ->check(CLI::Range(1, kMaxGridTasksPerNode))->capture_default_str();
  CLI::Option* time_opt =
      app.add_option("--time", time, std::string("walltime per run: ") + kSlurmTimeFormats)
          ->check(CLI::Validator(
              [](std::string& text) {
                return is_slurm_time(text) ? std::string()
                                           : "'" + text + "' is not a SLURM walltime; write " + kSlurmTimeFormats;
              },
              "SLURM_TIME"))
          ->capture_default_str();
  app.add_option("--sbatch", sbatch_extra, "extra #SBATCH option (repeatable), e.g. --sbatch=--gres=gpu:2");
  app.add_flag("--dry-run", dry_run, "print the scripts; write and submit nothing (says what an existing "
               "grid in --output-root would collide with)");
  app.add_flag("--overwrite", overwrite, "submit into an --output-root that holds an earlier grid: rewrites "
               "its job.sbatch files, keeps its grid.json as grid.json.<n>, deletes nothing (a run whose "
               "checkpoints/ holds checkpoints resumes from them)");
  app.footer("A key set in --config replaces the default shown; a flag given here replaces both.");
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
    if (output_root_opt->count()) spec.output_root = output_root;
    if (job_name_opt->count()) spec.job_name = job_name;
    if (command_opt->count()) spec.command = command;
    if (nodes_opt->count()) spec.nodes = nodes;
    if (ntasks_opt->count()) spec.ntasks_per_node = ntasks_per_node;
    if (time_opt->count()) spec.time = time;
    spec.overwrite = overwrite;
    for (const std::string& line : sbatch_extra) spec.sbatch_extra.push_back(line);
    for (const std::string& flag : params) spec.params.push_back(parse_param_flag(flag));

    std::vector<GridRun> runs = plan_grid(spec);
    if (dry_run) {
      std::cout << format_dry_run(runs, existing_grid_paths(runs), spec.overwrite);
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
