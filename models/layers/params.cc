#include "models/layers/params.h"

#include <algorithm>

#include "runtime/base/check.h"
#include "runtime/base/rng.h"

namespace strata {

std::string split_spelling(ParamSplit s, const std::vector<int64_t>& row_blocks) {
  switch (s) {
    case ParamSplit::kReplicated:
      return "replicated";
    case ParamSplit::kRows:
      return "rows";
    case ParamSplit::kCols:
      return "cols";
    case ParamSplit::kBlockRows: {
      std::string out = "block_rows:";
      for (size_t i = 0; i < row_blocks.size(); ++i)
        out += (i ? "," : "") + std::to_string(row_blocks[i]);
      return out;
    }
  }
  return "replicated";
}

bool parse_param_split(const std::string& s, int64_t full_rows, ParamSplit* out,
                       std::vector<int64_t>* row_blocks) {
  row_blocks->clear();
  if (s == "replicated" || s == "rows" || s == "cols") {
    *out = s == "rows"   ? ParamSplit::kRows
           : s == "cols" ? ParamSplit::kCols
                         : ParamSplit::kReplicated;
    return true;
  }
  if (s == "qkv_rows") {
    if (full_rows % 3 != 0) return false;
    *out = ParamSplit::kBlockRows;
    row_blocks->assign(3, full_rows / 3);
    return true;
  }
  const std::string prefix = "block_rows:";
  if (s.rfind(prefix, 0) != 0) return false;
  int64_t sum = 0;
  for (size_t at = prefix.size(); at <= s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string n = s.substr(at, comma - at);
    if (n.empty() || n.size() > 18 || n.find_first_not_of("0123456789") != std::string::npos)
      return false;
    row_blocks->push_back(std::stoll(n));
    sum += row_blocks->back();
    at = comma + 1;
  }
  *out = ParamSplit::kBlockRows;
  return sum == full_rows;
}

namespace {
// The rows of the full tensor that a rank's expert run covers (all of them without an expert
// split): the run's first row, its row count, and the row blocks [b0, b1) inside it.
struct ExpertRun {
  int64_t row0 = 0, rows = 0, row_len = 1;
  size_t b0 = 0, b1 = 0;
};
ExpertRun expert_run(const ParamInfo& p) {
  ExpertRun r;
  const int64_t full_rows = p.full_shape.empty() ? 1 : p.full_shape[0];
  r.row_len =
      p.full_shape.size() > 1 ? shape_numel(p.full_shape) / std::max<int64_t>(full_rows, 1) : 1;
  r.rows = full_rows / p.expert;
  r.row0 = p.expert_rank * r.rows;
  const size_t nb = p.row_blocks.size() / static_cast<size_t>(p.expert);
  r.b0 = static_cast<size_t>(p.expert_rank) * nb;
  r.b1 = r.b0 + nb;
  return r;
}
}  // namespace

int64_t global_index(const ParamInfo& p, int64_t local, int tp_rank, int tp) {
  const ExpertRun run = expert_run(p);
  const int64_t base = run.row0 * run.row_len;  // the run's first element in the full tensor
  switch (p.split) {
    case ParamSplit::kReplicated:
      return base + local;
    case ParamSplit::kRows:
      return base + local + tp_rank * p.numel;  // row-major: shard is contiguous
    case ParamSplit::kCols: {
      const int64_t cols = p.shape[1], full_cols = p.full_shape[1];
      return base + (local / cols) * full_cols + tp_rank * cols + local % cols;
    }
    case ParamSplit::kBlockRows: {
      // Local rows: block 0's rows of this rank, then block 1's, …
      const int64_t row = p.shape[0] > 0 ? p.numel / p.shape[0] : 0;  // elements per row
      int64_t r = local / row, full_start = run.row0;
      for (size_t b = run.b0; b < run.b1; ++b) {
        const int64_t block = p.row_blocks[b], local_rows = block / tp;
        if (r < local_rows) return (full_start + tp_rank * local_rows + r) * row + local % row;
        r -= local_rows;
        full_start += block;
      }
      return -1;  // outside the shard
    }
  }
  return local;
}

int64_t local_index(const ParamInfo& p, int64_t global, int tp_rank, int tp) {
  const ExpertRun run = expert_run(p);
  // Into the expert run (the whole tensor without an expert split).
  global -= run.row0 * run.row_len;
  if (global < 0 || global >= run.rows * run.row_len) return -1;
  switch (p.split) {
    case ParamSplit::kReplicated:
      return global < p.numel ? global : -1;
    case ParamSplit::kRows: {
      const int64_t local = global - tp_rank * p.numel;
      return local >= 0 && local < p.numel ? local : -1;
    }
    case ParamSplit::kCols: {
      const int64_t cols = p.shape[1], full_cols = p.full_shape[1];
      const int64_t row = global / full_cols, col = global % full_cols - tp_rank * cols;
      return col >= 0 && col < cols && row < p.shape[0] ? row * cols + col : -1;
    }
    case ParamSplit::kBlockRows: {
      const int64_t row = p.shape[0] > 0 ? p.numel / p.shape[0] : 0;  // elements per row
      if (row == 0) return -1;
      const int64_t r = global / row;
      int64_t full_start = 0, local_start = 0;
      for (size_t b = run.b0; b < run.b1; ++b) {
        const int64_t block = p.row_blocks[b], local_rows = block / tp;
        if (r < full_start + block) {
          const int64_t in_block = r - full_start - tp_rank * local_rows;
          if (in_block < 0 || in_block >= local_rows) return -1;
          return (local_start + in_block) * row + global % row;
        }
        full_start += block;
        local_start += local_rows;
      }
      return -1;
    }
  }
  return -1;
}

ParamRef ParamLayout::add(const ParamDecl& d) {
  ParamInfo p;
  p.name = d.name;
  p.full_shape = d.full_shape;
  p.split = d.split;
  p.shape = d.full_shape;
  if (d.expert) {
    STRATA_CHECK(
        !p.shape.empty() && p.shape[0] % ep_ == 0,
        d.name << ": " << (p.shape.empty() ? 0 : p.shape[0]) << " rows over expert " << ep_);
    STRATA_CHECK(d.row_blocks.size() % static_cast<size_t>(ep_) == 0,
                 d.name << ": " << d.row_blocks.size() << " row blocks over expert " << ep_);
    p.experts = true;
    p.expert = ep_;
    p.expert_rank = ep_rank_;
    p.shape[0] /= ep_;
  }
  if (d.split == ParamSplit::kRows || d.split == ParamSplit::kBlockRows) {
    STRATA_CHECK(p.shape[0] % tp_ == 0,
                 d.name << ": " << p.shape[0] << " rows over tensor " << tp_);
    p.shape[0] /= tp_;
  }
  if (d.split == ParamSplit::kBlockRows) {
    int64_t sum = 0;
    for (const int64_t block : d.row_blocks) {
      STRATA_CHECK(block % tp_ == 0,
                   d.name << ": a block of " << block << " rows over tensor " << tp_);
      sum += block;
    }
    STRATA_CHECK(sum == d.full_shape[0],
                 d.name << ": blocks of " << sum << " rows, shape has " << d.full_shape[0]);
    STRATA_CHECK(!d.expert || sum % ep_ == 0, d.name << ": blocks over expert " << ep_);
    p.row_blocks = d.row_blocks;
  }
  if (d.split == ParamSplit::kCols) {
    STRATA_CHECK(p.shape[1] % tp_ == 0,
                 d.name << ": " << p.shape[1] << " columns over tensor " << tp_);
    p.shape[1] /= tp_;
  }
  p.numel = shape_numel(p.shape);
  p.offset = numel_;
  p.init = d.init;
  p.std = d.std;
  p.decay = d.decay;
  p.rows_initialised = d.rows_initialised;
  STRATA_CHECK(index_.emplace(p.name, static_cast<int>(infos_.size())).second,
               "parameter " << p.name << " declared twice");
  numel_ += p.numel;
  infos_.push_back(std::move(p));
  return ParamRef{static_cast<int>(infos_.size()) - 1};
}

ParamRef ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? ParamRef{} : ParamRef{it->second};
}

ParamStore::ParamStore(ParamLayout layout, Backend& backend, bool bf16, uint64_t seed)
    : layout_(std::move(layout)), be_(backend), bf16_(bf16) {
  const int64_t n = layout_.numel();
  // Mixed precision keeps the fp32 parameters as the optimizer's master copy and computes with
  // a bf16 copy (Megatron's accounting: 2 bytes of parameters, 4 of gradients, 12 of optimizer).
  params_ = be_.empty({n}, bf16 ? MemCategory::kOptimizer : MemCategory::kParameters);
  if (bf16) params_lp_ = be_.empty({n}, MemCategory::kParameters, DType::kBF16);
  grads_ = be_.zeros({n}, MemCategory::kGradients);
  init(seed);
}

Tensor ParamStore::grad(ParamRef r) const {
  const ParamInfo& p = info(r);
  return grads_.view(p.offset, p.shape);
}

Tensor ParamStore::cparam(ParamRef r) const {
  const ParamInfo& p = info(r);
  return (bf16_ ? params_lp_ : params_).view(p.offset, p.shape);
}

void ParamStore::params_changed() {
  if (bf16_) be_.cast(params_lp_, params_);
}

void ParamStore::init(uint64_t seed) {
  // Values are produced on the host from global indices and uploaded, so every backend and every
  // tensor-parallel layout starts from the same model.
  std::vector<float> host(static_cast<size_t>(params_.numel()), 0.0f);
  for (const ParamInfo& p : infos()) {
    float* dst = host.data() + p.offset;
    switch (p.init) {
      case ParamInit::kZeros:
        break;
      case ParamInit::kOnes:
        std::fill(dst, dst + p.numel, 1.0f);
        break;
      case ParamInit::kNormal: {
        const uint64_t key = mix64(seed ^ hash_name(p.name));
        const int64_t row_len = p.full_shape.size() > 1 ? p.full_shape[1] : 1;
        for (int64_t i = 0; i < p.numel; ++i) {
          const int64_t g = global_index(p, i, layout_.tp_rank(), layout_.tp());
          if (p.rows_initialised >= 0 && g / row_len >= p.rows_initialised) continue;  // padding
          dst[i] = static_cast<float>(p.std * normal01(key, static_cast<uint64_t>(g)));
        }
        break;
      }
    }
  }
  be_.upload(params_, host.data());
  params_changed();
}

void ParamStore::use_grads(const Tensor& g) {
  STRATA_CHECK(g.numel() == grads_.numel(),
               "gradient buffer of " << g.numel() << " elements for a model of " << grads_.numel());
  grads_ = g;
}

void ParamStore::zero_grads() {
  be_.zero(grads_);
}

void ParamStore::use_params(const Tensor& p) {
  STRATA_CHECK(p.numel() == params_.numel(), "parameter buffer of " << p.numel()
                                                                    << " elements for a model of "
                                                                    << params_.numel());
  // 2bw switches versions per micro-batch: re-round the bf16 copy only on a real switch (a
  // version is written only while no micro-batch computes with it).
  if (p.data() == params_.data()) return;
  params_ = p;
  params_changed();
}

void ParamStore::report_ready(ParamRef first, ParamRef last) {
  if (!reporting_ || !ready_hook_) return;
  STRATA_CHECK(first.valid() && last.index >= first.index,
               "parameter range " << first.index << " .. " << last.index);
  // Runs of untied parameters, in order.
  int run = -1;
  for (int i = first.index; i <= last.index; ++i) {
    const bool tied = infos()[static_cast<size_t>(i)].tied;
    if (!tied && run < 0) run = i;
    if (tied && run >= 0) {
      ready_hook_(run, i);
      run = -1;
    }
  }
  if (run >= 0) ready_hook_(run, last.index + 1);
}

}  // namespace strata
