#include "launch/train/dry_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "launch/config/config_parse.h"
#include "launch/config/world_layout.h"
#include "launch/plan/prediction.h"
#include "launch/train/reporting.h"
#include "launch/train/trainer.h"
#include "models/registry.h"
#include "partitioner/figures.h"
#include "partitioner/layer_split.h"
#include "runtime/base/error.h"
#include "runtime/base/operation.h"
#include "runtime/memory/allocator.h"

namespace strata {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

namespace {

// This machine as one node whose memory `sharing` ranks share, `world_size` of them in all.
Cluster this_machine(const Config& cfg, int world_size, int sharing) {
  const nlohmann::json cluster = {
      {"name", "this-machine"},
      {"nodes", 1},
      {"gpus_per_node", world_size},
      {"peak_flops", {{"fp32", 1e11}, {"bf16", 1e11}}},
      {"memory_bytes", std::max<int64_t>(1, physical_memory_bytes() / std::max(1, sharing))},
      {"hbm_bandwidth", 2e10},
      {"intra_node", {{"bandwidth", 1e10}, {"latency_s", 2e-6}}},
      {"inter_node", {{"bandwidth", 1.25e9}, {"latency_s", 2e-5}}},
      {"nics_per_node", 1},
      {"device", cfg.device == "cuda" ? "gpu" : "cpu"}};
  return cluster_from_json(cluster, "<this machine>");
}

}  // namespace

nlohmann::json planner_prediction(const Config& cfg, int world_size) {
  return predict_for_config(cfg, world_size, this_machine(cfg, world_size, world().local_size));
}

nlohmann::json planner_prediction(const RunLayout& run) {
  return predict_for_config(*run.cfg, run.layout,
                            this_machine(*run.cfg, run.world->size, run.world->local_size));
}

std::string memory_shortfall(const RunLayout& run, int64_t device_bytes) {
  const nlohmann::json plan = planner_prediction(run);
  double peak = 0;
  for (const auto& st : plan.at("predicted").at("memory_bytes_per_stage"))
    peak = std::max(peak, st.at("total").get<double>());
  const int64_t per_rank = static_cast<int64_t>(peak);
  const bool gpu = device_bytes > 0;
  const int devices = std::max(1, cuda_device_count());
  const int sharing = gpu ? (run.world->local_size + devices - 1) / devices : run.world->local_size;
  const int64_t need = per_rank * sharing;
  // The host's memory: the machine's, or less where a cgroup (a Slurm job's) holds the ranks.
  const int64_t cgroup = gpu ? 0 : cgroup_memory_limit_bytes();
  const int64_t physical = physical_memory_bytes();
  const bool by_cgroup = cgroup > 0 && (physical <= 0 || cgroup < physical);
  const int64_t have = gpu ? device_bytes : by_cgroup ? cgroup : physical;
  if (have > 0 && need > have / 10 * 9)
    return std::string("a model that fits in ") +
           (gpu         ? "the GPU's memory"
            : by_cgroup ? "this job's memory"
                        : "this machine's memory") +
           ": training needs " + format_bytes(need) + " (" + std::to_string(sharing) +
           " rank(s) × " + format_bytes(per_rank) + "), the " +
           (gpu         ? "GPU has "
            : by_cgroup ? "cgroup's memory.max is "
                        : "machine has ") +
           format_bytes(have);
  // Each process's own address space (ulimit -v), which holds its libraries too.
  const int64_t space = gpu ? 0 : address_space_limit_bytes();
  if (space > 0 && per_rank > space / 10 * 9)
    return "a model that fits in this process's address space: a rank needs " +
           format_bytes(per_rank) + ", ulimit -v allows " + format_bytes(space);
  return "";
}

void check_fits_in_memory(const RunLayout& run, int64_t device_bytes) {
  const std::string shortfall = memory_shortfall(run, device_bytes);
  if (!shortfall.empty()) throw InputError(run.cfg->source_file, "model", shortfall);
}

namespace {

// The config's model, layout, batch and FLOPs on run's world (the job's, or one of --world).
void print_run_lines(const RunLayout& run, std::ostream& os) {
  const Config& cfg = *run.cfg;
  const std::unique_ptr<ModelDescription> desc = describe_model(cfg.model);
  const int e = run.layout.expert;
  const int64_t per_rank =
      rank_parameters(*desc, run.layout.tensor, e, 0, 1, 0, desc->num_layers()).total();
  const int64_t real = desc->parameters();
  const FlopCount f = desc->flops_per_iteration(run.global, run.layout.recompute);
  os << "model: " << desc->summary() << " (padded " << desc->padded_vocab(run.layout.tensor)
     << ")\n";
  os << "parameters: " << real << " (" << si(static_cast<double>(real)) << "), " << per_rank
     << " on each rank (tensor " << run.layout.tensor
     << (e > 1 ? ", expert " + std::to_string(e) : "") << ")\n";
  if (desc->num_experts() > 0)
    os << "experts per rank: " << desc->num_experts() / e << " of " << desc->num_experts()
       << " (expert " << e << ")\n";
  const int cp = run.layout.context;
  os << "parallel: tensor " << run.layout.tensor
     << (cp > 1 ? " × context " + std::to_string(cp) : std::string()) << " × pipeline "
     << run.layout.pipeline << " × data " << run.layout.data << " = " << run.world->size << " ranks"
     << (e > 1 ? ", expert groups of " + std::to_string(e) + " data ranks" : "")
     << (cp > 1 ? ", each sequence split over " + std::to_string(cp) + " ranks (ring attention, " +
                      std::to_string(run.seq_len / cp) + " tokens each)"
                : "")
     << (run.layout.sequence_parallel ? ", sequence parallel" : "")
     << (run.layout.distributed_optimizer ? ", distributed optimizer" : "") << "\n";
  if (run.layout.pipeline > 1) {
    const ScheduleSpec spec = run.train_spec();
    // The training banner's words, from the same split (partitioner/layer_split.h).
    os << "pipeline: " << to_string(spec.kind) << ", " << run.layout.num_microbatches
       << " micro-batches, " << spec.chunks << " chunk(s) per stage, layers per piece "
       << split_text(run.layout.layers_per_piece) << "\n";
  }
  os << "batch: global " << run.global << " sequences = " << run.layout.num_microbatches
     << " micro-batches of " << run.layout.micro_batch_size << " × data " << run.layout.data << " ("
     << static_cast<int64_t>(run.global) * run.seq_len << " tokens per iteration)\n";
  os << "FLOPs per iteration: model " << si(f.model) << "FLOP, hardware " << si(f.hardware)
     << "FLOP\n";
}

// The planner's memory model (partitioner/), which follows the schedule's in-flight
// micro-batches per stage; tests/mpi_test_memory.cc checks it against the allocator.
void print_memory_table(const std::vector<MemoryBreakdown>& stages, std::ostream& os) {
  os << "predicted memory per rank, by pipeline stage:\n";
  const char* kinds[] = {"parameters", "gradients", "optimizer", "activations", "buffers", "total"};
  os << "  stage";
  for (const char* k : kinds) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " %13s", k);
    os << buf;
  }
  os << "\n";
  for (size_t st = 0; st < stages.size(); ++st) {
    const MemoryBreakdown& m = stages[st];
    char buf[32];
    std::snprintf(buf, sizeof buf, "  %5zu", st);
    os << buf;
    for (double v : {m.parameters, m.gradients, m.optimizer, m.activations, m.buffers, m.total()}) {
      std::snprintf(buf, sizeof buf, " %13s", format_bytes(static_cast<int64_t>(v)).c_str());
      os << buf;
    }
    os << "\n";
  }
}

std::string layout_words(const ParallelLayout& c) {
  std::string s = "tensor " + std::to_string(c.tensor);
  if (c.context > 1) s += " × context " + std::to_string(c.context);
  s += " × pipeline " + std::to_string(c.pipeline) + " × data " + std::to_string(c.data);
  if (c.expert > 1) s += " (expert " + std::to_string(c.expert) + ")";
  s += ", micro-batch " + std::to_string(c.micro_batch_size) + " × " +
       std::to_string(c.num_microbatches);
  if (c.pipeline > 1) {
    s += ", " + std::string(to_string(c.schedule));
    if (c.virtual_stages > 1) s += " with " + std::to_string(c.virtual_stages) + " chunks";
  }
  s += ", recompute " + std::string(to_string(c.recompute));
  if (c.sequence_parallel) s += ", sequence parallel";
  if (c.distributed_optimizer) s += ", distributed optimizer";
  return s;
}

// A prediction in words: time and its parts, throughput, MFU, memory against the device's.
void print_prediction_words(const PlanRequest& req, const PlanResult& r, std::ostream& os) {
  const IterationTime& t = r.time;
  const int ranks = req.cluster.world_size();
  const double tokens = static_cast<double>(req.global_batch_size) * req.model->seq_len();
  os << "  iteration " << seconds_text(t.iteration_s) << ": pipeline " << seconds_text(t.pipeline_s)
     << " (bubble " << percent_text(t.bubble_fraction) << ", tensor-parallel exposed "
     << seconds_text(t.tp_exposed_s);
  if (r.config.context > 1) os << ", ring exposed " << seconds_text(t.cp_exposed_s);
  if (r.config.expert > 1) os << ", all-to-all exposed " << seconds_text(t.ep_exposed_s);
  os << "), data-parallel exposed " << seconds_text(t.dp_exposed_s) << ", optimizer "
     << seconds_text(t.optimizer_s) << "\n";
  os << "  throughput " << count_text(tokens / t.iteration_s, "tokens/s") << " ("
     << count_text(tokens / t.iteration_s / ranks, "per rank") << "), " << three(r.tflops_per_gpu)
     << " TFLOP/s per rank with recomputation, MFU " << percent_text(r.mfu) << " of "
     << three(req.cluster.peak(req.precision) / 1e12) << " TFLOP/s " << req.precision << "\n";
  const double have = req.cluster.memory_bytes;
  os << "  memory: peak " << bytes_text(r.peak_memory) << " per rank (stage " << r.peak_stage
     << ") of " << bytes_text(have) << ": "
     << (r.peak_memory <= have ? "fits" : "does NOT fit (" + three(r.peak_memory / have) + "×)")
     << "\n";
}

// The fastest layout `strata plan` finds for the same model, batch and ranks, when it is faster
// than the config's (or the config's does not fit); `plan_hint` is the command that shows it.
void print_plan_comparison(const PlanRequest& req, const PlanResult& mine,
                           const std::string& plan_hint, std::ostream& os) {
  PlanRequest search = req;
  search.top_k = 1;
  const PlanOutput out = search_plans(search);
  const bool fits = mine.peak_memory <= req.cluster.memory_bytes;
  if (out.plans.empty()) {
    os << "strata plan finds no layout of these " << req.cluster.world_size()
       << " ranks that fits this model and batch"
       << (plan_hint.empty() ? "" : " (" + plan_hint + " and says why)") << "\n";
    return;
  }
  const PlanResult& best = out.plans.front();
  const double speedup = mine.time.iteration_s / best.time.iteration_s;
  if (fits && speedup < 1.02) {
    os << "strata plan finds nothing faster on these ranks (its best: "
       << seconds_text(best.time.iteration_s) << " per iteration)\n";
    return;
  }
  os << "strata plan finds a faster layout that fits: " << layout_words(best.config) << ": "
     << seconds_text(best.time.iteration_s) << " per iteration, MFU " << percent_text(best.mfu);
  if (fits) os << ", " << three(speedup) << "× faster";
  os << "\n";
  if (!plan_hint.empty()) os << "  (" << plan_hint << ")\n";
}

// Which cluster a --world dry run predicts for: --cluster, else a cuda config's default GPU
// cluster, else this machine shared by the N ranks.
Cluster dry_run_cluster(const Config& cfg, int world_size, const std::string& cluster_arg,
                        std::string* label) {
  if (!cluster_arg.empty()) {
    *label = cluster_arg;
    return load_cluster(cluster_arg, configs_dir());
  }
  if (cfg.device == "cuda") {
    *label = std::string(kDefaultGpuCluster) + " (a cuda config's default; --cluster to choose)";
    return load_cluster(kDefaultGpuCluster, configs_dir());
  }
  *label = "this machine, shared by the " + std::to_string(world_size) + " ranks";
  return this_machine(cfg, world_size, world_size);
}

// The planner's request for cfg on world_size ranks of cluster: a GPU cluster runs the CUDA
// backend (its memory and runtime), whatever device the config names.
PlanRequest cluster_request(const Config& cfg, int world_size, const Cluster& cluster) {
  Config on = cfg;
  on.device = cluster.cpu ? "cpu" : "cuda";
  return plan_request_for_config(on, world_size, cluster);
}

}  // namespace

void print_dry_run(const Config& cfg, const RunContext& ctx, std::ostream& os) {
  const RunLayout run = make_run_layout(cfg, ctx.single_process);
  ProcessGroups g = run.host_groups();
  const bool cuda = run.tensor_device() == Device::kCUDA;
  const std::string table =
      rank_table(g, cuda ? "cuda:" + std::to_string(local_device_index()) : "cpu");
  if (run.world->rank != 0) return;
  print_run_lines(run, os);
  if (run.world->size > 1)
    os << "tensors between ranks: " << to_string(run.transport(run.tensor_device())) << "\n";
  const PlanRequest req = plan_request_for_config(
      cfg, run.world->size, this_machine(cfg, run.world->size, run.world->local_size));
  print_memory_table(evaluate_plan(req, run.layout).memory, os);
  // (The GPU's memory is not known without the device: a CUDA run checks it when it starts.)
  const std::string shortfall = cuda ? "" : memory_shortfall(run, 0);
  if (!shortfall.empty())
    os << "memory: training here would stop (exit 2), it needs " << shortfall << "\n"
       << "  (strata train --dry-run --world N --cluster C predicts for other machines)\n";
  os << "ranks:\n" << table;
}

namespace {

// The config's layout on `world_size` ranks of the dry run's cluster, evaluated once.
struct ClusterPrediction {
  std::string label;  // the cluster, as the header names it
  bool cpu = false;
  PlanRequest req;
  PlanResult mine;
};

ClusterPrediction predict_on_cluster(const Config& cfg, int world_size,
                                     const std::string& cluster_arg) {
  ClusterPrediction p;
  const Cluster cluster = dry_run_cluster(cfg, world_size, cluster_arg, &p.label);
  if (world_size > cluster.gpus_per_node && world_size % cluster.gpus_per_node != 0)
    throw InputError(
        "<command line>", "--world",
        "whole nodes of " + cluster.name + " (" + std::to_string(cluster.gpus_per_node) +
            " ranks each) or at most one, got " + std::to_string(world_size) + " ranks");
  p.cpu = cluster.cpu;
  p.req = cluster_request(cfg, world_size, cluster);
  p.mine = evaluate_plan(p.req, layout_for_world(cfg, world_size));
  return p;
}

// The prediction's header, words and the comparison with strata plan's search.
void print_prediction(const Config& cfg, const std::string& cluster_arg, const ClusterPrediction& p,
                      std::ostream& os) {
  const PlanRequest& req = p.req;
  auto count = [](int n, const std::string& what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  os << "predicted on " << p.label << ": " << count(req.cluster.nodes, "node") << " × "
     << count(req.cluster.gpus_per_node, p.cpu ? "rank" : "GPU") << ", " << cfg.train.precision
     << ", " << (p.cpu ? "the CPU" : "Strata's CUDA") << " runtime"
     << (cfg.device == (p.cpu ? "cuda" : "cpu") ? " (the config says device " + cfg.device + ")"
                                                : "")
     << "\n";
  print_prediction_words(req, p.mine, os);
  // The command that lists the plans (for this machine's figures there is no preset to name).
  std::string hint;
  if (!cluster_arg.empty() || cfg.device == "cuda")
    hint = "strata plan --model " + cfg.source_file + " --cluster " +
           (cluster_arg.empty() ? std::string(kDefaultGpuCluster) : cluster_arg) + " --nodes " +
           std::to_string(req.cluster.nodes) + " lists them" +
           (cfg.command_line_keys.empty() ? "" : ", once the --set changes are in the file");
  print_plan_comparison(req, p.mine, hint, os);
}

}  // namespace

void print_cluster_prediction(const Config& cfg, int world_size, const std::string& cluster_arg,
                              std::ostream& os) {
  print_prediction(cfg, cluster_arg, predict_on_cluster(cfg, world_size, cluster_arg), os);
}

void print_world_dry_run(const Config& cfg, int world_size, const std::string& cluster_arg,
                         std::ostream& os) {
  validate_for_world(cfg, world_size, "--world");
  const ClusterPrediction p = predict_on_cluster(cfg, world_size, cluster_arg);
  World w;  // the world of --world, seen from its rank 0
  w.size = world_size;
  w.local_size = std::min(world_size, p.req.cluster.gpus_per_node);
  RunLayout run;
  run.cfg = &cfg;
  run.world = &w;
  run.layout = layout_for_world(cfg, world_size);
  run.bf16 = cfg.train.precision == "bf16";
  run.global = cfg.train.global_batch_size;
  run.seq_len = cfg.model.seq_len;
  print_run_lines(run, os);
  print_memory_table(p.mine.memory, os);
  print_prediction(cfg, cluster_arg, p, os);
}

}  // namespace strata
