// golden_compare.h — what the golden tests against PyTorch fixtures (test_llama_golden.cc,
// test_bert_golden.cc) share: element-wise comparison with a tolerance relative to the largest
// reference value or absolute, and the fixture's AdamW recipe as Strata's optimizer config.
//
// Thread-safety: plain functions, called from one test thread.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/train/model_state.h"
#include "models/layers/params.h"
#include "runtime/base/config.h"
#include "runtime/engine/optimizer.h"

namespace strata::golden {

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Mismatches of got against want beyond tol_rel × max|want| (or tol_abs when given), the first
// three reported.
inline int compare(const std::string& what, const std::vector<float>& got,
                   const std::vector<float>& want, double tol_rel_to_max, double tol_abs = 0) {
  EXPECT_EQ(got.size(), want.size()) << what;
  const double tol = tol_abs > 0 ? tol_abs : tol_rel_to_max * std::max(max_abs(want), 1e-30);
  int bad = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > tol) {
      if (bad < 3)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                      << " (tolerance " << tol << ")";
      ++bad;
    }
  return bad;
}

// The fixture's optimizer (its config's lr, min_lr, warmup_iters, decay_iters, betas, eps,
// weight_decay, grad_clip; cosine decay) as Strata's.
inline OptimizerConfig optimizer_of(const nlohmann::json& cfg) {
  OptimizerConfig o;
  o.lr = cfg["lr"];
  o.min_lr = cfg["min_lr"];
  o.warmup_iters = cfg["warmup_iters"];
  o.decay_iters = cfg["decay_iters"].get<int>();
  o.decay = "cosine";
  o.beta1 = cfg["beta1"];
  o.beta2 = cfg["beta2"];
  o.eps = cfg["eps"];
  o.weight_decay = cfg["weight_decay"];
  o.grad_clip = cfg["grad_clip"];
  return o;
}

// One optimizer segment per parameter of a one-rank model (state laid out as the parameters).
inline std::vector<OptSegment> whole_segments(const ParamStore& params) {
  std::vector<OptSegment> segments;
  for (const ParamInfo& p : params.infos())
    segments.push_back({p.offset, p.offset, p.numel, p.decay});
  return segments;
}

// A one-rank model's flat buffer (parameters or gradients) as our full tensors, by name.
inline FullTensors full_tensors(const ParamStore& params, const float* flat) {
  FullTensors ours;
  for (const ParamInfo& p : params.infos())
    ours[p.name] = {p.full_shape, std::vector<float>(flat + p.offset, flat + p.offset + p.numel)};
  return ours;
}

// Our full tensors (an adapter's from_hf of a fixture's weights) into a one-rank model's
// parameters; `path` names the fixture in errors.
inline void load_full_tensors(ParamStore& params, const FullTensors& ours,
                              const std::string& path) {
  std::vector<float> flat(static_cast<size_t>(params.numel()));
  fill_params(params.layout(), ours, flat, path);
  std::copy(flat.begin(), flat.end(), params.params().f32());
}

}  // namespace strata::golden
