#include "launch/cli.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/commands/data.h"
#include "launch/commands/eval.h"
#include "launch/commands/export.h"
#include "launch/commands/generate.h"
#include "launch/commands/plan.h"
#include "launch/commands/profile.h"
#include "launch/commands/schedule.h"
#include "launch/commands/timeline_svg.h"
#include "launch/config/config_parse.h"
#include "launch/plan/plan_file.h"
#include "launch/plan/prediction.h"
#include "launch/train/stop_request.h"
#include "launch/train/trainer.h"
#include "runtime/backend/backend.h"
#include "runtime/base/abort_hook.h"
#include "runtime/base/check.h"
#include "runtime/base/error.h"
#include "runtime/base/operation.h"
#include "runtime/comm/comm.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

const char* kUsage =
    "usage: strata <command> [options]\n"
    "\n"
    "Train transformer language models with tensor, pipeline and data parallelism.\n"
    "Launch several ranks with: mpirun -np N strata train --config FILE\n"
    "\n"
    "commands:\n"
    "  train     train a model from a JSON config (strata train --help)\n"
    "  plan      find the fastest parallel layout that fits a cluster (strata plan --help)\n"
    "  schedule  print and simulate a pipeline schedule (strata schedule --help)\n"
    "  trace-svg draw one iteration of a run's log.trace (strata trace-svg --help)\n"
    "  profile   time each layer, or measure this device's curves, for the planner (strata\n"
    "            profile --help)\n"
    "  export    write a checkpoint as a Hugging Face model (strata export --help)\n"
    "  data      tokenize text into a dataset (data prepare), a tiktoken file into a\n"
    "            tokenizer.json (data convert) (strata data --help)\n"
    "  generate  text from a checkpoint or a Hugging Face model (strata generate --help)\n"
    "  eval      loss on a dataset, accuracy on a multiple-choice task (strata eval --help)\n"
    "\n"
    "options:\n"
    "  --help     this text; `strata <command> --help` for a command's options\n"
    "  --version  version, the compiled-in backends and the CPU backend's GEMM kernels\n";

const char* kTrainUsage =
    "usage: strata train --config FILE [--set section.key=value ...] [--plan PLAN.json]\n"
    "                    [--dry-run [--world N] [--cluster FILE|PRESET]]\n"
    "\n"
    "Trains the model of FILE (keys: docs/config.md).\n"
    "\n"
    "options:\n"
    "  --config FILE        the JSON config; unknown keys are errors\n"
    "  --set KEY=VALUE      override a key, e.g. --set train.iterations=50 (VALUE parsed as\n"
    "                       JSON, else taken as a string); repeatable\n"
    "  --plan PLAN.json     run a plan written by `strata plan --json`: its first plan sets\n"
    "                       parallel.*, the micro-batch size and recompute; it must be for\n"
    "                       the config's model and global batch\n"
    "  --dry-run            print the model size, FLOPs per iteration, predicted memory per\n"
    "                       category and the rank table, then exit without training\n"
    "  --world N            with --dry-run: predict for N ranks from this one process (any\n"
    "                       model size: nothing is allocated), on --cluster, else on\n"
    "                       dgx-h100 for a cuda config, else on this machine\n"
    "  --cluster C          with --dry-run: also print the planner's prediction of this config\n"
    "                       on cluster C (a preset of configs/clusters or a JSON file) in\n"
    "                       words, and the faster layout strata plan finds, if any\n"
    "  --help               this text\n"
    "\n"
    "exit status: 0 done, 2 bad input (one line: error: <file>: <key>: <expected>), 1 failure,\n"
    "             3 done, but a log (log.metrics, log.trace) could not be written completely,\n"
    "             4 stopped by SIGTERM or SIGUSR1 after saving a checkpoint (run again to "
    "resume)\n";

// The run finished (its checkpoints and results are complete) but a log file could not be
// written completely: a full disk, say (README's exit statuses).
constexpr int kExitLogsIncomplete = 3;
// SIGTERM / SIGUSR1 stopped the run after saving a checkpoint (launch/train/stop_request.h).
constexpr int kExitStopped = 4;

[[noreturn]] void usage_error(const std::string& where, const std::string& what) {
  throw InputError("<command line>", where, what);
}

int cmd_train(const std::vector<std::string>& args) {
  std::string config_path, plan_path, cluster;
  std::vector<std::string> sets;
  bool dry_run = false;
  int world_n = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= args.size()) usage_error(flag, "a value after " + std::string(flag));
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kTrainUsage, stdout);
      return 0;
    } else if (a == "--config") {
      config_path = value("--config");
    } else if (a.rfind("--config=", 0) == 0) {
      config_path = a.substr(9);
    } else if (a == "--set") {
      sets.push_back(value("--set"));
    } else if (a.rfind("--set=", 0) == 0) {
      sets.push_back(a.substr(6));
    } else if (a == "--dry-run") {
      dry_run = true;
    } else if (a == "--plan") {
      plan_path = value("--plan");
    } else if (a == "--cluster") {
      cluster = value("--cluster");
    } else if (a == "--world") {
      const std::string v = value("--world");
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > (1 << 20))
        usage_error("--world", "a rank count from 1 to 1048576, got '" + v + "'");
      world_n = static_cast<int>(n);
    } else {
      usage_error(a,
                  "an option of strata train (--config, --set, --plan, --dry-run, --world, "
                  "--cluster, --help)");
    }
  }
  if (!dry_run && world_n > 0)
    usage_error("--world", "--dry-run with it (--world sizes a prediction, not a run)");
  if (!dry_run && !cluster.empty())
    usage_error("--cluster", "--dry-run with it (the cluster a prediction is for)");
  if (config_path.empty()) usage_error("--config", "a config file: strata train --config FILE");
  Config cfg = load_config(config_path, sets);
  if (!plan_path.empty()) {
    cfg = apply_plan(cfg, read_json_file(plan_path), plan_path);
  }
  RunContext ctx;
  if (dry_run) {
    if (world_n > 0) {
      // A prediction from one process; under mpirun rank 0 speaks for the job.
      if (world().rank == 0) print_world_dry_run(cfg, world_n, cluster, std::cout);
      return 0;
    }
    try {
      print_dry_run(cfg, ctx, std::cout);
    } catch (const InputError& e) {
      // A layout for more ranks than this job has: say how to see it without them.
      if (e.expected().find("world size") == std::string::npos || world().size > 1) throw;
      throw InputError(e.file(), e.where(),
                       e.expected() + " (strata train --dry-run --world N predicts for N ranks " +
                           "from one process)");
    }
    if (!cluster.empty() && world().rank == 0)
      print_cluster_prediction(cfg, world().size, cluster, std::cout);
    return 0;
  }
  const TrainResult r = run_training(cfg, ctx);
  if (!r.incomplete_logs.empty()) {
    std::string logs;
    for (const std::string& l : r.incomplete_logs) logs += (logs.empty() ? "" : ", ") + l;
    std::fprintf(stderr, "strata train: done, but the logs are incomplete (%s): exit status %d\n",
                 logs.c_str(), kExitLogsIncomplete);
    return kExitLogsIncomplete;
  }
  return r.stopped_by_signal ? kExitStopped : 0;
}

int dispatch(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("strata %s\nbackends: %s\ncpu: %s\n", STRATA_VERSION, compiled_backends().c_str(),
                cpu_kernels().c_str());
    return 0;
  }
  if (cmd == "train") return cmd_train(args);
  if (cmd == "schedule") return cmd_schedule(args);
  if (cmd == "plan") return cmd_plan(args);
  if (cmd == "profile") return cmd_profile(args);
  if (cmd == "trace-svg") return cmd_trace_svg(args);
  if (cmd == "export") return cmd_export(args);
  if (cmd == "data") return cmd_data(args);
  if (cmd == "generate") return cmd_generate(args);
  if (cmd == "eval") return cmd_eval(args);
  usage_error(cmd,
              "a command: train, plan, schedule, profile, trace-svg, export, data, generate "
              "or eval (see strata --help)");
}

// comm.timeout_s of the config the command line names (--config FILE, --set overrides; the
// default without one): the deadline of MPI start-up, before any command has read its config,
// and of the shutdown after. A config that does not load is reported by the command itself.
double comm_timeout_s(int argc, char** argv) {
  std::string config;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--config" && has_value) {
      config = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config = a.substr(9);
    } else if (a == "--set" && has_value) {
      sets.push_back(argv[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      sets.push_back(a.substr(6));
    }
  }
  try {
    return load_config(config, sets).comm.timeout_s;
  } catch (const std::exception&) {
    return CommConfig{}.timeout_s;
  }
}

}  // namespace

int run_cli(int argc, char** argv) {
  // `strata train` records stop signals from its first instant (stop_request.h): a SIGTERM during
  // start-up or a resume asks for a stop, it does not kill the process.
  if (argc > 1 && std::strcmp(argv[1], "train") == 0) {
    install_stop_handlers();
    // Test hook: the signal the handlers just took over, as if sent during start-up.
    if (const char* s = std::getenv("STRATA_TEST_SIGNAL_AT_START")) ::raise(std::atoi(s));
  }
  int status = 0;
  const double timeout_s = comm_timeout_s(argc, argv);
  try {
    init_world(&argc, &argv, timeout_s);
    status = dispatch(argc, argv);
  } catch (const InputError& e) {
    // Bad input in the config or a file every rank reads is found alike on every rank: the
    // lowest of them prints the one line. A rank that found it alone (a token of the data only it
    // reads), while the others wait for it in the training's collectives, prints its own and
    // ends the job at once, with status 2, instead of leaving them to the watchdog.
    const int printer = input_error_agreement(kInputErrorAgreementS);
    // An error about a relative path of the config says what the path counts from.
    const std::string note = config_path_note(e.file(), e.where());
    const std::string line =
        note.empty() ? e.what() : InputError(e.file(), e.where(), e.expected() + note).what();
    if (printer < 0 || printer == world().rank) std::fprintf(stderr, "%s\n", line.c_str());
    if (printer < 0) abort_job(2);
    status = 2;
  } catch (const std::bad_alloc&) {
    // An allocation of host memory failed (the device allocator names its own, with the bytes
    // and what they were for): say so, naming the command, rather than a bare "std::bad_alloc".
    const std::string limit = memory_limit_text();
    std::fprintf(stderr,
                 "[rank %d host %s] error: out of host memory in strata %s (an allocation failed): "
                 "the model, batch or inputs are larger than this process holds%s\n",
                 process_rank(), process_host().c_str(), argc > 1 ? argv[1] : "",
                 limit.empty() ? "" : (" (" + limit + ")").c_str());
    std::fflush(stderr);
    if (world().size > 1) abort_job(1);
    status = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d host %s] error: %s\n", process_rank(), process_host().c_str(),
                 e.what());
    std::fflush(stderr);
    if (world().size > 1) abort_job(1);  // the other ranks may be blocked in a collective
    status = 1;
  }
  finalize_world(timeout_s);
  return status;
}

}  // namespace strata
