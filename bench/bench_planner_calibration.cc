// bench_planner_calibration — the planner's predicted TFLOP/s per GPU beside Megatron-Core's
// published H100 weak-scaling results (issue 6; docs/planner.md, calibration table).
//
// Each row fixes the published layout (t, p, d = 48, micro-batch 1, bf16, sequence 4096,
// vocabulary 131072, untied embeddings, sequence parallelism with t > 1, distributed
// optimizer, interleaved schedule when p > 1) and lets the planner choose the rest (virtual
// stages, recomputation) within memory. The published figures count model FLOPs only
// (no recomputation), so the prediction printed is the model-FLOP rate: MFU · 989 TFLOP/s.
// Prints figures; never fails on them.
#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <string>

#include "launch/config_parse.h"
#include "partitioner/planner.h"

namespace {

struct Row {
  const char* name;
  int heads, hidden, layers, t, p, gpus, batch;
  double published;
};

const Row kRows[] = {
    {"1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8},
    {"7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9},
    {"16B", 48, 6144, 32, 4, 1, 192, 192, 489.1},
    {"32B", 56, 7168, 48, 8, 1, 384, 192, 459.6},
    {"70B", 64, 8192, 84, 8, 2, 768, 384, 419.7},
    {"119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5},
    {"177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8},
    {"314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4},
    {"462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9},
};

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  // Optional "name=value" arguments override cost-model constants (sensitivity studies).
  CostParams params;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos) continue;
    const double v = std::stod(a.substr(eq + 1));
    const std::string k = a.substr(0, eq);
    if (k == "gemm_max_eff") params.gemm_max_eff = v;
    if (k == "gemm_half_dim") params.gemm_half_dim = v;
    if (k == "attn_fwd_eff") params.attn_fwd_eff = v;
    if (k == "attn_bwd_eff") params.attn_bwd_eff = v;
    if (k == "mem_eff") params.mem_eff = v;
    if (k == "net_eff") params.net_eff = v;
    if (k == "tp_overlap") params.tp_overlap = v;
    if (k == "dp_overlap") params.dp_overlap = v;
    if (k == "kernel_overhead_s") params.kernel_overhead_s = v;
    if (k == "p2p_exposed") params.p2p_exposed = v;
  }
  const Cluster h100 = load_cluster("dgx-h100", configs_dir());
  std::printf("Megatron-Core weak scaling on H100 (seq 4096, vocab 131072, bf16): TFLOP/s per GPU\n");
  std::printf("%-6s %3s %3s %5s %3s %-9s %8s %7s %7s %7s %7s %10s %9s %8s\n", "model", "t", "p",
              "GPUs", "v", "recompute", "iter_s", "bubble", "tp_s", "dp_s", "opt_s", "predicted",
              "published", "error");
  double sum_abs = 0, max_abs = 0, search_ms = 0;
  int n = 0;
  for (const Row& r : kRows) {
    PlanRequest req;
    req.model.name = r.name;
    req.model.num_layers = r.layers;
    req.model.hidden_size = r.hidden;
    req.model.num_heads = r.heads;
    req.model.ffn_hidden_size = 4 * r.hidden;
    req.model.seq_len = 4096;
    req.model.vocab_size = 131072;
    req.model.tie_embeddings = false;
    req.cluster = h100;
    req.cluster.nodes = r.gpus / h100.gpus_per_node;
    req.global_batch_size = r.batch;
    req.precision = "bf16";
    req.memory.precision = "bf16";
    req.memory.flash_attention = true;
    req.memory.reserve_bytes = 1024.0 * 1024.0 * 1024.0;
    req.fixes.tensor = r.t;
    req.fixes.pipeline = r.p;
    req.fixes.micro_batch_size = 1;
    req.fixes.sequence_parallel = r.t > 1;
    req.fixes.distributed_optimizer = true;
    req.fixes.schedule = r.p > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
    req.top_k = 1;
    req.params = params;
    const auto t0 = std::chrono::steady_clock::now();
    const PlanOutput out = search_plans(req);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (out.plans.empty()) {
      std::printf("%-6s no plan fits: %s\n", r.name,
                  out.rejected.empty() ? "?" : out.rejected.front().reason.c_str());
      continue;
    }
    const PlanResult& best = out.plans.front();
    const double pred = best.mfu * h100.peak("bf16") / 1e12;
    const double err = (pred - r.published) / r.published * 100;
    sum_abs += std::fabs(err);
    max_abs = std::max(max_abs, std::fabs(err));
    ++n;
    std::printf("%-6s %3d %3d %5d %3d %-9s %8.3f %6.1f%% %7.3f %7.3f %7.3f %10.1f %9.1f %+7.1f%%\n",
                r.name, r.t, r.p, r.gpus, best.config.virtual_stages,
                to_string(best.config.recompute), best.time.iteration_s,
                best.time.bubble_fraction * 100, best.time.tp_exposed_s, best.time.dp_exposed_s,
                best.time.optimizer_s, pred, r.published, err);
    search_ms = std::max(search_ms, ms);
  }
  std::printf("rows %d: mean absolute error %.1f%%, max %.1f%% (target: <= 5%%, none over 10%%); "
              "slowest search %.1f ms\n",
              n, n ? sum_abs / n : 0.0, max_abs, search_ms);
  return 0;
}
