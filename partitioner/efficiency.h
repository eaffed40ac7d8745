// efficiency.h — what one device achieves, as measured: GEMM time as a function of shape and
// precision, fused attention throughput by (sequence, head size), the bandwidth of memory-bound
// ops, the gap between kernels, and the share of a single kernel's throughput a device keeps
// inside a training step. Carried by the cluster description ("efficiency", cluster.h), one set
// per GPU (configs/clusters/*.json cite where each figure comes from), written for the local
// device by `strata profile --cluster-out` (launch/commands/profile.h), read by the cost model.
//
// JSON (every key but "gemm" optional):
//   "efficiency": {
//     "source": "where the figures come from",
//     "sustained": 0.8,              compute-bound throughput kept in a training step (clocks
//                                    under a node's power limit, collectives' kernels beside)
//     "gemm": {"bf16": {"flops": 8.1e14, "fixed_s": 5e-6, "bandwidth": 2.9e12,
//                       "points": [[M, N, K, FLOP/s], ...]}},
//     "attention": {"bf16": {"forward": [[seq, head_size, FLOP/s], ...],
//                            "backward": [[seq, head_size, FLOP/s], ...]}},
//     "memory_bandwidth": 2.9e12,    bytes/s of elementwise kernels
//     "optimizer_bandwidth": 2.9e12, bytes/s of the optimizer step's passes (else memory's)
//     "kernel_gap_s": 2e-6}          idle time between two dependent kernels
//
// GEMM model: t(M, N, K) = fixed_s + max(2·M·N·K / flops, e·(M·K + K·N + M·N) / bandwidth)
// for element size e, times a correction toward the measured points near (M, N, K) in log
// space: exp(Σ w_i·log(t_i / t_curve_i) / (Σ w_i + w_0)) with w_i = exp(-d_i² / (2σ²)), d_i
// the distance in octaves of (M, N, K) to point i, σ = 0.75 octave, w_0 = 0.05 (far from every
// point the curve stands alone). fit_gemm_curve() finds flops, fixed_s and bandwidth from
// points by least squares on log time. Attention: FLOP/s interpolated linearly in log(seq) and
// log(head size) between table entries, held at the table's edges. FLOPs count the causal half
// of the 4·b·s²·h score and value products forward, twice that backward (FlashAttention's own
// convention, so its published figures read directly).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata {

struct GemmCurve {
  double flops = 0;      // FLOP/s of large GEMMs
  double fixed_s = 0;    // per-GEMM time that does not scale (launch, ramp-up, last wave)
  double bandwidth = 0;  // bytes/s its operands stream at when it is memory bound
  std::vector<std::array<double, 4>> points;  // measured (M, N, K, FLOP/s)
  bool generic = false;  // from a spec sheet (generic_efficiency), not measured

  bool empty() const { return flops <= 0; }
  // Seconds of one (M, N, K) GEMM with `elem_bytes` per element, `batch` of them in one kernel
  // (a batched GEMM), computing at `compute_share` of the curve's FLOP/s.
  double seconds(double M, double N, double K, double elem_bytes, double batch = 1,
                 double compute_share = 1) const;
  // The curve alone, without the correction toward the points.
  double curve_seconds(double M, double N, double K, double elem_bytes, double batch = 1,
                       double compute_share = 1) const;
};

// Least-squares fit of flops, fixed_s and bandwidth to `points` (log time); keeps the points.
// Precondition: at least 3 points with positive figures.
GemmCurve fit_gemm_curve(const std::vector<std::array<double, 4>>& points, double elem_bytes);

struct AttentionTable {
  std::vector<std::array<double, 3>> forward, backward;  // (seq, head size, FLOP/s)
  bool generic = false;
  bool empty() const { return forward.empty() || backward.empty(); }
  // FLOP/s at (seq, head_size), interpolated. Precondition: !empty().
  double flops(double seq, double head_size, bool backward_pass) const;
};

struct DeviceEfficiency {
  std::string source;
  double sustained = 1.0;
  std::map<std::string, GemmCurve> gemm;            // by precision
  std::map<std::string, AttentionTable> attention;  // by precision
  double memory_bandwidth = 0;
  double optimizer_bandwidth = 0;  // 0: memory_bandwidth
  double kernel_gap_s = 0;

  bool empty() const { return gemm.empty(); }
  // The curve for `precision` (bf16 falls back to fp16 and fp16 to bf16); nullptr when none.
  const GemmCurve* gemm_for(const std::string& precision) const;
  const AttentionTable* attention_for(const std::string& precision) const;
  double optimizer_rate() const {
    return optimizer_bandwidth > 0 ? optimizer_bandwidth : memory_bandwidth;
  }
};

// Parses the "efficiency" object; InputError(file, "efficiency.<path>", expected) when bad.
DeviceEfficiency efficiency_from_json(const nlohmann::json& j, const std::string& file);
nlohmann::json efficiency_to_json(const DeviceEfficiency& e);

// A device without measured figures: curves from its spec sheet alone (GEMMs at 70% of the
// dense peak, attention at 35% forward and 25% backward, elementwise kernels at 80% of the
// memory bandwidth, 3 µs between kernels), marked generic. The planner says when it uses them.
DeviceEfficiency generic_efficiency(const std::map<std::string, double>& peak_flops,
                                    double memory_bandwidth);
// Adds generic curves for the precisions of peak_flops that `e` has none for (a cluster
// measured in bf16 can still be asked for an fp32 plan). efficiency_to_json leaves them out.
void add_generic_curves(DeviceEfficiency* e, const std::map<std::string, double>& peak_flops,
                        double memory_bandwidth);

}  // namespace strata
