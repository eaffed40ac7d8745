#include "launch/train/dry_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "launch/plan/prediction.h"
#include "launch/train/reporting.h"
#include "launch/train/trainer.h"
#include "models/registry.h"
#include "partitioner/layer_split.h"
#include "runtime/base/error.h"
#include "runtime/memory/allocator.h"

namespace strata {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

namespace {

// This machine as one node whose memory the ranks on it share, `world_size` of them.
Cluster this_machine(const Config& cfg, int world_size) {
  const nlohmann::json cluster = {
      {"name", "this-machine"},
      {"nodes", 1},
      {"gpus_per_node", world_size},
      {"peak_flops", {{"fp32", 1e11}, {"bf16", 1e11}}},
      {"memory_bytes",
       std::max<int64_t>(1, physical_memory_bytes() / std::max(1, world().local_size))},
      {"hbm_bandwidth", 2e10},
      {"intra_node", {{"bandwidth", 1e10}, {"latency_s", 2e-6}}},
      {"inter_node", {{"bandwidth", 1.25e9}, {"latency_s", 2e-5}}},
      {"nics_per_node", 1},
      {"device", cfg.device == "cuda" ? "gpu" : "cpu"}};
  return cluster_from_json(cluster, "<this machine>");
}

}  // namespace

nlohmann::json planner_prediction(const Config& cfg, int world_size) {
  return predict_for_config(cfg, world_size, this_machine(cfg, world_size));
}

nlohmann::json planner_prediction(const RunLayout& run) {
  return predict_for_config(*run.cfg, run.layout, this_machine(*run.cfg, run.world->size));
}

void check_fits_in_memory(const RunLayout& run, int64_t device_bytes) {
  const Config& cfg = *run.cfg;
  const nlohmann::json plan = planner_prediction(run);
  double peak = 0;
  for (const auto& st : plan.at("predicted").at("memory_bytes_per_stage"))
    peak = std::max(peak, st.at("total").get<double>());
  const int64_t per_rank = static_cast<int64_t>(peak);
  const bool gpu = device_bytes > 0;
  const int devices = std::max(1, cuda_device_count());
  const int sharing = gpu ? (run.world->local_size + devices - 1) / devices : run.world->local_size;
  const int64_t need = per_rank * sharing;
  const int64_t have = gpu ? device_bytes : physical_memory_bytes();
  if (have > 0 && need > have / 10 * 9) {
    throw InputError(cfg.source_file, "model",
                     std::string("a model that fits in ") +
                         (gpu ? "the GPU's memory" : "this machine's memory") +
                         ": training needs " + format_bytes(need) + " (" + std::to_string(sharing) +
                         " rank(s) × " + format_bytes(per_rank) + "), the " +
                         (gpu ? "GPU" : "machine") + " has " + format_bytes(have));
  }
}

void print_dry_run(const Config& cfg, const RunContext& ctx, std::ostream& os) {
  const RunLayout run = make_run_layout(cfg, ctx.single_process);
  ProcessGroups g = run.host_groups();
  const bool cuda = run.tensor_device() == Device::kCUDA;
  const std::string table =
      rank_table(g, cuda ? "cuda:" + std::to_string(local_device_index()) : "cpu");
  // (The GPU's memory is not known without the device: a CUDA run checks it when it starts.)
  if (!cuda) check_fits_in_memory(run, 0);
  if (run.world->rank != 0) return;
  const std::unique_ptr<ModelDescription> desc = describe_model(cfg.model);
  const int e = run.layout.expert;
  const int64_t per_rank =
      rank_parameters(*desc, run.layout.tensor, e, 0, 1, 0, desc->num_layers()).total();
  const int64_t real = desc->parameters();
  const FlopCount f = desc->flops_per_iteration(run.global, run.layout.recompute);
  const nlohmann::json plan = planner_prediction(run);
  const nlohmann::json& stages = plan.at("predicted").at("memory_bytes_per_stage");
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
  if (run.world->size > 1)
    os << "tensors between ranks: " << to_string(run.transport(run.tensor_device())) << "\n";
  os << "batch: global " << run.global << " sequences = " << run.layout.num_microbatches
     << " micro-batches of " << run.layout.micro_batch_size << " × data " << run.layout.data << " ("
     << static_cast<int64_t>(run.global) * run.seq_len << " tokens per iteration)\n";
  os << "FLOPs per iteration: model " << si(f.model) << "FLOP, hardware " << si(f.hardware)
     << "FLOP\n";
  // The planner's memory model (partitioner/), which follows the schedule's in-flight
  // micro-batches per stage; tests/mpi_test_memory.cc checks it against the allocator.
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
    char buf[32];
    std::snprintf(buf, sizeof buf, "  %5zu", st);
    os << buf;
    for (const char* k : kinds) {
      std::snprintf(buf, sizeof buf, " %13s",
                    format_bytes(static_cast<int64_t>(stages[st].at(k).get<double>())).c_str());
      os << buf;
    }
    os << "\n";
  }
  os << "ranks:\n" << table;
}

}  // namespace strata
