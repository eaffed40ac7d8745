#include "launch/train/model_state.h"

#include <algorithm>
#include <functional>

#include "runtime/base/error.h"

namespace strata {
namespace {

// Reads the split of `p` (its full shape set) from the metadata's spelling.
void split_from(const std::string& s, const std::string& path, ParamInfo& p) {
  const int64_t rows = p.full_shape.empty() ? 0 : p.full_shape[0];
  if (!parse_param_split(s, rows, &p.split, &p.row_blocks))
    throw InputError(path, "meta:" + p.name,
                     "split replicated, rows, cols, qkv_rows or block_rows:R0,R1,… summing to " +
                         std::to_string(rows) + " rows, got " + s);
}

// The parameter whose flat range holds `offset` (segments never cross parameters).
const ParamInfo& param_at(const std::vector<ParamInfo>& infos, int64_t offset) {
  for (const ParamInfo& p : infos)
    if (offset >= p.offset && offset < p.offset + p.numel) return p;
  throw std::logic_error("optimizer segment outside the parameters");
}

bool is_writer(const ParamInfo& p, int tp_rank) {
  // The last stage's copy of a tied parameter is the first stage's parameter again; replicated
  // parameters are equal on every tensor rank.
  return !p.tied_copy && (p.split != ParamSplit::kReplicated || tp_rank == 0);
}

ShardMeta meta_of(const ParamInfo& p, const ParamLayout& l) {
  ShardMeta m;
  m.full_shape = p.full_shape;
  m.shard_shape = p.shape;
  m.split = split_spelling(p.split, p.row_blocks);
  m.tp_rank = p.split == ParamSplit::kReplicated ? 0 : l.tp_rank();
  m.tp = p.split == ParamSplit::kReplicated ? 1 : l.tp();
  m.expert = p.expert;
  m.expert_rank = p.expert_rank;
  return m;
}

// The parameter as a shard of another layout saved it (its metadata).
ParamInfo saved_info(const std::string& name, const ShardMeta& m, const std::string& path) {
  ParamInfo saved;
  saved.name = name;
  saved.shape = m.shard_shape;
  saved.full_shape = m.full_shape;
  split_from(m.split, path, saved);
  saved.numel = shape_numel(m.shard_shape);
  saved.experts = m.expert > 1;
  saved.expert = m.expert;
  saved.expert_rank = m.expert_rank;
  if (m.expert > 1 && saved.row_blocks.size() % static_cast<size_t>(m.expert) != 0)
    throw InputError(
        path, "meta:" + name,
        "row blocks that divide over expert " + std::to_string(m.expert) + ", got " + m.split);
  return saved;
}

// Whether this rank writes the parameter's values (and, without ZeRO-1, its optimizer state): the
// first replica of it — rank 0 of the data × context group, or for an expert-split parameter of
// its expert-data-parallel group (the ranks holding the same experts).
bool first_replica(const ParamInfo& p, Replica r) {
  return (p.experts ? r.expert : r.dense) == 0;
}

// Checks that a full tensor of `shape` can serve `p`: the same shape, or (vocabulary padding)
// the same trailing dimensions with another row count.
void check_compatible(const ParamInfo& p, const Shape& shape, const std::string& path) {
  const bool same_tail = shape.size() == p.full_shape.size() && !shape.empty() &&
                         std::equal(shape.begin() + 1, shape.end(), p.full_shape.begin() + 1);
  const bool vocab = p.rows_initialised >= 0;
  if (shape == p.full_shape || (vocab && same_tail)) return;
  throw InputError(path, p.name,
                   "shape " + shape_string(p.full_shape) + ", found " + shape_string(shape));
}

// Elements of one row of the full parameter (its trailing dimensions).
int64_t row_elements(const Shape& full) {
  int64_t n = 1;
  for (size_t i = 1; i < full.size(); ++i) n *= full[i];
  return n;
}

constexpr int64_t kReadChunk = int64_t{1} << 20;  // floats per read: 4 MiB

// Elements [lo, hi) of this rank's shard of `p` (local indices) from the checkpoint's kind:name
// into dst[0, hi − lo); returns how many were set. Rows past the saved tensor's (the vocabulary
// padded for a larger tensor-parallel size) count as set: they stay zero.
int64_t read_shard_range(const ParamInfo& p, int tp_rank, int tp, int64_t lo, int64_t hi,
                         CheckpointReader& ck, const std::string& kind, float* dst,
                         const char* what) {
  const std::vector<PieceLocation>& pieces = ck.pieces(kind, p.name);
  if (pieces.empty()) throw InputError(ck.path(), p.name, what);
  std::fill(dst, dst + (hi - lo), 0.0f);
  if (hi <= lo) return 0;
  const int64_t row = row_elements(p.full_shape), rows = p.full_shape[0];
  const int64_t local_row = p.shape[0] > 0 ? p.numel / p.shape[0] : 1;
  // The full rows the range covers, as intervals: local rows map to full rows in increasing
  // order (a row block's rows, then the next block's), so a row at a time suffices.
  std::vector<std::pair<int64_t, int64_t>> need;  // [first, end) full rows
  for (int64_t l = lo; l < hi; l = (l / local_row + 1) * local_row) {
    const int64_t r = global_index(p, l, tp_rank, tp) / row;
    if (!need.empty() && need.back().second == r)
      need.back().second = r + 1;
    else if (need.empty() || need.back().second < r + 1)
      need.emplace_back(r, r + 1);
  }
  int64_t set = 0, saved_rows = rows;
  std::vector<float> buf;
  for (const PieceLocation& pc : pieces) {
    const ShardMeta& m = *ck.meta(pc.rank, p.name);  // the reader checked every piece has one
    check_compatible(p, m.full_shape, ck.path());
    saved_rows = m.full_shape[0];
    const ParamInfo saved = saved_info(p.name, m, ck.path());
    // The saved piece's element i lies in full row row_of(i), nondecreasing in i.
    const auto row_of = [&](int64_t i) {
      return global_index(saved, pc.local_begin + i, m.tp_rank, m.tp) / row;
    };
    const auto first_at_or_after = [&](int64_t r) {
      int64_t a = 0, b = pc.count;
      while (a < b) {
        const int64_t mid = a + (b - a) / 2;
        if (row_of(mid) < r)
          a = mid + 1;
        else
          b = mid;
      }
      return a;
    };
    for (const auto& [ra, rb] : need) {
      const int64_t a = first_at_or_after(ra), b = first_at_or_after(rb);
      for (int64_t at = a; at < b; at += kReadChunk) {
        const int64_t n = std::min(kReadChunk, b - at);
        buf.resize(static_cast<size_t>(n));
        ck.read(pc, at, n, buf.data());
        for (int64_t i = 0; i < n; ++i) {
          const int64_t g = global_index(saved, pc.local_begin + at + i, m.tp_rank, m.tp);
          if (g < 0 || g / row >= rows) continue;  // a padded row this layout does not have
          const int64_t l = local_index(p, g, tp_rank, tp);
          if (l < lo || l >= hi) continue;
          dst[l - lo] = buf[static_cast<size_t>(i)];
          ++set;
        }
      }
    }
  }
  if (saved_rows < rows)
    for (int64_t l = lo; l < hi; ++l) set += global_index(p, l, tp_rank, tp) / row >= saved_rows;
  return set;
}

}  // namespace

namespace {

// Where a piece's values come from: (kind "param", "param_prev", "m" or "v", first element of the
// flat parameters or the compact state, count, destination).
using CopyOut = std::function<void(const std::string&, int64_t, int64_t, float*)>;

RankShard rank_shard(const ParamLayout& layout, const std::vector<OptSegment>& segments,
                     Replica replica, bool sharded, bool previous, const CopyOut& copy) {
  RankShard s;
  const auto piece = [&](const std::string& kind, const std::string& name, int64_t local_begin,
                         int64_t from, int64_t n) {
    ShardPiece p{kind, name, local_begin, std::vector<float>(static_cast<size_t>(n))};
    copy(kind, from, n, p.values.data());
    return p;
  };
  // One kind after another in the file (param, param_prev, m, v): a rank loading one kind reads
  // blocks of that kind only.
  std::vector<ShardPiece> prev, ms, vs;
  for (const ParamInfo& p : layout.infos()) {
    if (!is_writer(p, layout.tp_rank()) || !first_replica(p, replica)) continue;
    s.meta[p.name] = meta_of(p, layout);
    s.pieces.push_back(piece("param", p.name, 0, p.offset, p.numel));
    if (previous) prev.push_back(piece("param_prev", p.name, 0, p.offset, p.numel));
  }
  for (const OptSegment& g : segments) {
    const ParamInfo& p = param_at(layout.infos(), g.param_offset);
    // Without ZeRO-1 the state is replicated over the data group.
    if (!is_writer(p, layout.tp_rank()) || (!sharded && !first_replica(p, replica))) continue;
    s.meta[p.name] = meta_of(p, layout);
    ms.push_back(piece("m", p.name, g.param_offset - p.offset, g.state_offset, g.numel));
    vs.push_back(piece("v", p.name, g.param_offset - p.offset, g.state_offset, g.numel));
  }
  for (std::vector<ShardPiece>* kind : {&prev, &ms, &vs})
    for (ShardPiece& p : *kind) s.pieces.push_back(std::move(p));
  return s;
}

}  // namespace

RankShard make_rank_shard(const ParamLayout& layout, const std::vector<float>& params,
                          const std::vector<float>& m, const std::vector<float>& v,
                          const std::vector<OptSegment>& segments, Replica replica, bool sharded,
                          const std::vector<float>* previous) {
  return rank_shard(layout, segments, replica, sharded, previous != nullptr,
                    [&](const std::string& kind, int64_t from, int64_t n, float* dst) {
                      const std::vector<float>& src = kind == "param"        ? params
                                                      : kind == "param_prev" ? *previous
                                                      : kind == "m"          ? m
                                                                             : v;
                      std::copy(src.begin() + from, src.begin() + from + n, dst);
                    });
}

RankShard make_rank_shard(const ParamLayout& layout, Backend& be, const Tensor& params,
                          const Tensor& m, const Tensor& v, const std::vector<OptSegment>& segments,
                          Replica replica, bool sharded, const Tensor* previous) {
  return rank_shard(layout, segments, replica, sharded, previous != nullptr,
                    [&](const std::string& kind, int64_t from, int64_t n, float* dst) {
                      const Tensor& src = kind == "param"        ? params
                                          : kind == "param_prev" ? *previous
                                          : kind == "m"          ? m
                                                                 : v;
                      if (n > 0) be.download(dst, src.view(from, {n}));
                    });
}

FullTensors assemble_full(const std::vector<RankShard>& shards, const std::string& kind,
                          const std::set<std::string>& names, const std::string& path) {
  FullTensors full;
  std::map<std::string, int64_t> filled;
  for (const RankShard& s : shards)
    for (const ShardPiece& piece : s.pieces) {
      if (piece.kind != kind || (!names.empty() && !names.count(piece.name))) continue;
      const ShardMeta& m = s.meta.at(piece.name);
      const ParamInfo p = saved_info(piece.name, m, path);
      FullTensor& f = full[piece.name];
      if (f.data.empty()) {
        f.shape = m.full_shape;
        f.data.assign(static_cast<size_t>(shape_numel(m.full_shape)), 0.0f);
      }
      // Replicated and row-split shards are contiguous in the full tensor: one copy.
      if (p.split == ParamSplit::kReplicated || p.split == ParamSplit::kRows) {
        const int64_t g0 = global_index(p, piece.local_begin, m.tp_rank, m.tp);
        const int64_t n = static_cast<int64_t>(piece.values.size());
        if (g0 < 0 || g0 + n > static_cast<int64_t>(f.data.size()))
          throw InputError(path, kind + ":" + piece.name, "elements inside the full shape");
        std::copy(piece.values.begin(), piece.values.end(), f.data.begin() + g0);
        filled[piece.name] += n;
        continue;
      }
      for (size_t i = 0; i < piece.values.size(); ++i) {
        const int64_t g =
            global_index(p, piece.local_begin + static_cast<int64_t>(i), m.tp_rank, m.tp);
        if (g < 0 || g >= static_cast<int64_t>(f.data.size()))
          throw InputError(path, kind + ":" + piece.name, "elements inside the full shape");
        f.data[static_cast<size_t>(g)] = piece.values[i];
      }
      filled[piece.name] += static_cast<int64_t>(piece.values.size());
    }
  for (const auto& [name, f] : full)
    if (filled[name] != static_cast<int64_t>(f.data.size()))
      throw InputError(path, kind + ":" + name,
                       "every element once: " + std::to_string(filled[name]) + " written of " +
                           std::to_string(f.data.size()));
  return full;
}

float shard_value(const ParamInfo& p, const FullTensor& f, int64_t local, int tp_rank, int tp) {
  const int64_t g = global_index(p, local, tp_rank, tp);
  // Rows past the stored tensor are vocabulary padding of a larger tensor-parallel size.
  return g < static_cast<int64_t>(f.data.size()) ? f.data[static_cast<size_t>(g)] : 0.0f;
}

void fill_params(const ParamLayout& layout, const FullTensors& full, std::vector<float>& params,
                 const std::string& path) {
  const int tp = layout.tp(), tp_rank = layout.tp_rank();
  for (const ParamInfo& p : layout.infos()) {
    auto it = full.find(p.name);
    if (it == full.end()) throw InputError(path, p.name, "a tensor for this parameter");
    check_compatible(p, it->second.shape, path);
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t g = global_index(p, i, tp_rank, tp);
      // Padded vocabulary rows stay zero whatever the file holds there.
      const bool pad = p.rows_initialised >= 0 && g / p.full_shape[1] >= p.rows_initialised;
      params[static_cast<size_t>(p.offset + i)] =
          pad ? 0.0f : shard_value(p, it->second, i, tp_rank, tp);
    }
  }
}

void fill_state(const ParamLayout& layout, const FullTensors& full,
                const std::vector<OptSegment>& segments, std::vector<float>& state,
                const std::string& path) {
  for (const OptSegment& g : segments) {
    const ParamInfo& p = param_at(layout.infos(), g.param_offset);
    auto it = full.find(p.name);
    if (it == full.end()) throw InputError(path, p.name, "optimizer state for this parameter");
    check_compatible(p, it->second.shape, path);
    for (int64_t i = 0; i < g.numel; ++i)
      state[static_cast<size_t>(g.state_offset + i)] =
          shard_value(p, it->second, g.param_offset - p.offset + i, layout.tp_rank(), layout.tp());
  }
}

void load_params(const ParamLayout& layout, CheckpointReader& ck, const std::string& kind,
                 std::vector<float>& params) {
  const int tp = layout.tp(), tp_rank = layout.tp_rank();
  for (const ParamInfo& p : layout.infos()) {
    float* dst = params.data() + p.offset;
    const int64_t set =
        read_shard_range(p, tp_rank, tp, 0, p.numel, ck, kind, dst, "a tensor for this parameter");
    if (set != p.numel)
      throw InputError(ck.path(), kind + ":" + p.name,
                       "every element of this rank's shard once: " + std::to_string(set) +
                           " read of " + std::to_string(p.numel));
    // Padded vocabulary rows stay zero whatever the file holds there.
    if (p.rows_initialised >= 0)
      for (int64_t i = 0; i < p.numel; ++i)
        if (global_index(p, i, tp_rank, tp) / p.full_shape[1] >= p.rows_initialised) dst[i] = 0;
    expect_finite(ck.path(), kind + ":" + p.name, dst, p.numel);
  }
}

void load_state(const ParamLayout& layout, CheckpointReader& ck, const std::string& kind,
                const std::vector<OptSegment>& segments, std::vector<float>& state) {
  for (const OptSegment& g : segments) {
    const ParamInfo& p = param_at(layout.infos(), g.param_offset);
    const int64_t lo = g.param_offset - p.offset;
    const int64_t set =
        read_shard_range(p, layout.tp_rank(), layout.tp(), lo, lo + g.numel, ck, kind,
                         state.data() + g.state_offset, "optimizer state for this parameter");
    if (set != g.numel)
      throw InputError(ck.path(), kind + ":" + p.name,
                       "every element of this rank's optimizer state once: " + std::to_string(set) +
                           " read of " + std::to_string(g.numel));
  }
}

void check_checkpoint_holds(const ParamLayout& layout, const CheckpointReader& ck) {
  const std::string file = ck.path() + "/run_state.json";
  std::set<std::string> names;
  for (const ParamInfo& p : layout.infos()) {
    names.insert(p.name);
    const std::vector<PieceLocation>& pieces = ck.pieces("param", p.name);
    if (pieces.empty())
      throw InputError(file, "model",
                       "a model whose parameters the shards hold; no tensor for " + p.name);
    const ShardMeta& m = *ck.meta(pieces.front().rank, p.name);
    try {
      check_compatible(p, m.full_shape, file);
    } catch (const InputError&) {
      throw InputError(file, "model",
                       "a model whose parameters the shards hold; " + p.name + " has shape " +
                           shape_string(p.full_shape) + " here, " + shape_string(m.full_shape) +
                           " in the shards");
    }
  }
  for (const std::string& n : ck.names("param"))
    if (!names.count(n))
      throw InputError(file, "model",
                       "a model whose parameters the shards hold; the shards hold " + n +
                           ", which it does not have");
}

}  // namespace strata
