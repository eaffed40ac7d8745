// mpi_test_util.h — shared by the multi-rank tests (mpi_test_*.cc), after nccl-tests: inputs from
// (seed, rank), expected results computed locally, mismatch counts summed over the world so every
// rank reaches the same verdict, summaries printed by rank 0 only.
//
// Inputs are small integers (|v| <= 16): sums over up to 8 ranks stay exact in f32, i32 and bf16
// (bf16 holds integers up to 256 exactly) in any reduction order, so results compare for equality.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "launch/train/trainer.h"
#include "models/registry.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace mpitest {

// The host communicator over the world that sums verdicts (set by the test's main).
inline Communicator*& verdict_comm() {
  static Communicator* c = nullptr;
  return c;
}

inline void print_on_rank0_only(int world_rank) {
  if (world_rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
}

inline uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Input element i of `rank` for the case `seed`.
inline int value(uint64_t seed, int rank, size_t i) {
  const uint64_t h = mix(seed ^ mix(static_cast<uint64_t>(rank) * 1000003u + 1) ^ mix(i + 0x51ed));
  return static_cast<int>(h % 33) - 16;
}

// The reduction over ranks [0, ranks) of value(seed, r, i).
inline int reduced(uint64_t seed, size_t i, ReduceOp op, int ranks) {
  int acc = value(seed, 0, i);
  for (int r = 1; r < ranks; ++r) {
    const int v = value(seed, r, i);
    acc = op == ReduceOp::kSum ? acc + v : std::max(acc, v);
  }
  return acc;
}

// A host buffer of one dtype holding small integers.
struct Buf {
  DType dtype;
  std::vector<char> bytes;  // one spare byte: data() is never null, even for 0 elements
  Buf(DType t, size_t n) : dtype(t), bytes(n * dtype_size(t) + 1, 0) {}
  void* data() { return bytes.data(); }
  size_t size_bytes() const { return bytes.size() - 1; }
  void set(size_t i, int v) {
    const float f = static_cast<float>(v);
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&bytes[i * 4], &f, 4);
        break;
      case DType::kI32: {
        const int32_t x = v;
        std::memcpy(&bytes[i * 4], &x, 4);
        break;
      }
      case DType::kBF16: {  // truncation is exact: small integers have < 8 significant bits
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
    }
  }
  double get(size_t i) const {
    float f = 0;
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&f, &bytes[i * 4], 4);
        return f;
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, &bytes[i * 4], 4);
        return x;
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, &bytes[i * 2], 2);
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        std::memcpy(&f, &u, 4);
        return f;
      }
    }
    return 0;
  }
};

// Input of `rank`: element i is value(seed, rank, offset + i).
inline Buf input(DType t, size_t n, uint64_t seed, int rank, size_t offset = 0) {
  Buf b(t, n);
  for (size_t i = 0; i < n; ++i) b.set(i, value(seed, rank, offset + i));
  return b;
}

inline std::string label(const char* what, DType t, size_t n, const char* op = "") {
  return std::string(what) + " " + to_string(t) + " n=" + std::to_string(n) + " " + op;
}

// This rank's mismatches over the cases of one check.
struct Tally {
  int cases = 0;
  int64_t mismatches = 0;
  std::string first_bad;
  void add(const std::string& what, int64_t bad) {
    ++cases;
    if (bad != 0 && first_bad.empty()) first_bad = what;
    mismatches += bad;
  }
  // Sums the mismatches over the world: the verdict is the same on every rank, and rank 0
  // prints the summary line.
  void expect_clean(const char* check) const {
    int32_t total = static_cast<int32_t>(std::min<int64_t>(mismatches, INT32_MAX / 64));
    verdict_comm()->all_reduce(&total, 1, DType::kI32, ReduceOp::kSum);
    if (world().rank == 0) {
      std::printf("  %-24s %4d cases on %d ranks, %d mismatches\n", check, cases,
                  verdict_comm()->size(), total);
      std::fflush(stdout);
    }
    EXPECT_EQ(total, 0) << check << ": first bad case on world rank " << world().rank << ": "
                        << (first_bad.empty() ? "none" : first_bad);
  }
};

// The model family the layout tests run on: STRATA_TEST_ARCH names an architecture of the
// registry (ctest's *_llama_*, *_bert_* entries; unset: the tests' own GPT), trained at its tiny
// preset with `heads` query heads. An architecture with grouped-query attention gets heads/2
// key/value heads (or STRATA_TEST_KV_HEADS of them), so t = 2 and t = 4 hold several or one
// key/value head per rank; a masked-LM one (BERT: post-norm encoder, padded bidirectional
// attention, the tied masked-LM decoder and the sentence head) trains on masked-LM samples of the
// synthetic chain's documents, whose 48 tokens stay below its four special ones. The sets go after
// a test's own (they override its preset and head count).
inline std::vector<std::string> arch_sets(int heads) {
  const char* name = std::getenv("STRATA_TEST_ARCH");
  if (name == nullptr) return {};
  const std::vector<std::string> names = architecture_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    ADD_FAILURE() << "STRATA_TEST_ARCH: an architecture of the registry, got " << name;
    return {};
  }
  const ArchSpec& arch = architecture(name);
  std::vector<std::string> sets = {"model.preset=" + arch.tiny_preset,
                                   "model.num_heads=" + std::to_string(heads)};
  if (arch.grouped_query) {
    const char* kv = std::getenv("STRATA_TEST_KV_HEADS");
    sets.push_back("model.num_key_value_heads=" +
                   (kv ? std::string(kv) : std::to_string(heads / 2)));
  }
  if (arch.masked_lm) sets.push_back("data.synthetic.vocab_size=48");
  // STRATA_TEST_SETS: more --set overrides, separated by ',' (the mixtures of experts start
  // from a larger init_std in the pipeline and checkpoint runs: tests/mpi_tests.cmake).
  if (const char* more = std::getenv("STRATA_TEST_SETS")) {
    std::string rest = more;
    for (size_t at; !rest.empty(); rest = at == std::string::npos ? "" : rest.substr(at + 1)) {
      at = rest.find(',');
      if (at != 0) sets.push_back(rest.substr(0, at));
    }
  }
  return sets;
}

// |got − want| within rel of |want| (1e-6 floor), for the equivalence tests' losses and norms.
inline bool close_rel(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * std::max(std::fabs(want), 1e-6);
}

// ---- training runs against the single process (the layout tests) ----

// One empty directory for the job, named from rank 0's pid: /tmp/strata_mpi_<what>_<pid>_<name>.
inline std::string job_dir(const std::string& what, const std::string& name) {
  std::string d = "/tmp/strata_mpi_" + what + "_" + std::to_string(::getpid()) + "_" + name;
  d = all_gather_strings(*verdict_comm(), d)[0];
  if (world().rank == 0) std::filesystem::remove_all(d);
  verdict_comm()->barrier();
  return d;
}

// Losses and gradient norms of `r` off `ref` by more than rel (other lengths count one).
inline int64_t count_run_off(const TrainResult& r, const TrainResult& ref, double rel) {
  int64_t bad = r.losses.size() != ref.losses.size();
  for (size_t i = 0; !bad && i < ref.losses.size(); ++i)
    bad += !close_rel(r.losses[i], ref.losses[i], rel) +
           !close_rel(r.grad_norms[i], ref.grad_norms[i], rel);
  return bad;
}

// Elements of this rank's final parameters (its tensor shard tp_rank of t, of expert run
// expert_rank of e) off the single-process model's `ref`, by global index, by more than 1e-5 +
// 1e-5 relative; padded vocabulary rows (beyond the single run's padding) must stay exactly 0.
inline int64_t count_params_off(const TrainResult& r, const TrainResult& ref, const ModelConfig& m,
                                int t, int tp_rank, bool sp, int e = 1, int expert_rank = 0) {
  const ParamLayout full = model_layout(m, 1, 0, false, whole_model(m.num_layers));
  const ParamLayout mine =
      model_layout(m, t, tp_rank, sp, whole_model(m.num_layers), e, expert_rank);
  int64_t bad = static_cast<int64_t>(r.final_params.size()) != mine.numel();
  for (const ParamInfo& p : mine.infos()) {
    const ParamInfo& f = full.info(full.find(p.name));
    const int64_t row_len = p.full_shape.size() > 1 ? p.full_shape[1] : 1;
    for (int64_t i = 0; !bad && i < p.numel; ++i) {
      const int64_t g = global_index(p, i, tp_rank, t);
      const float got = r.final_params[static_cast<size_t>(p.offset + i)];
      const bool padded = p.rows_initialised >= 0 && g / row_len >= f.numel / row_len;
      const float want = padded ? 0.0f : ref.final_params[static_cast<size_t>(f.offset + g)];
      bad += std::fabs(got - want) > 1e-5 + 1e-5 * std::fabs(want);
      if (bad)
        std::printf("rank %d: %s[%lld] %.9g, single process %.9g\n", world().rank, p.name.c_str(),
                    static_cast<long long>(g), got, want);
    }
  }
  return bad;
}

// Trains under `from` saving at iteration `at` (in a job directory of `what`), resumes under
// `to`: bit for bit (losses and norms) with the uninterrupted run when `exact` (the same layout),
// else within 1e-5 of the single process `ref`. `name` labels the verdict.
inline void expect_resumed(const std::function<TrainResult(std::vector<std::string>)>& train,
                           std::vector<std::string> from, std::vector<std::string> to,
                           const std::string& name, int at, bool exact, const TrainResult& ref,
                           const std::string& what) {
  const std::string dir = job_dir(what, "reshard");
  from.insert(from.end(), {"checkpoint.dir=" + dir, "checkpoint.interval=" + std::to_string(at)});
  const TrainResult full = train(from);
  to.push_back("checkpoint.resume=" + dir + "/iter_" + std::to_string(at));
  const TrainResult r = train(to);
  const size_t k0 = static_cast<size_t>(at);
  int64_t bad = r.start_iteration != at || r.losses.size() + k0 != full.losses.size();
  for (size_t i = 0; !bad && i < r.losses.size(); ++i) {
    bad += exact ? r.losses[i] != full.losses[k0 + i] || r.grad_norms[i] != full.grad_norms[k0 + i]
                 : !close_rel(r.losses[i], ref.losses[k0 + i], 1e-5);
  }
  Tally tally;
  tally.add(name, bad);
  if (world().rank == 0)
    std::printf("%s: final loss resumed %.9f, uninterrupted %.9f, single process %.9f\n",
                name.c_str(), r.losses.empty() ? 0.0 : r.losses.back(), full.losses.back(),
                ref.losses.back());
  tally.expect_clean(name.c_str());
  verdict_comm()->barrier();
  if (world().rank == 0) std::filesystem::remove_all(dir);
}

// main() of a multi-rank gtest binary: the world, a verdict communicator, results from rank 0.
inline int run_all_tests(int argc, char** argv) {
  const World w = init_world(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  print_on_rank0_only(w.rank);
  int rc = 0;
  {
    auto verdict =
        make_world_communicator(w.size > 1 ? CommBackend::kMPI : CommBackend::kLocal, 60);
    verdict_comm() = verdict.get();
    rc = RUN_ALL_TESTS();
  }
  finalize_world();
  return rc;
}

}  // namespace mpitest
}  // namespace strata
