#include "launch/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "launch/config_parse.h"
#include "models/gpt.h"
#include "runtime/backend.h"
#include "runtime/comm.h"
#include "runtime/data.h"
#include "runtime/error.h"
#include "runtime/grad_reducer.h"
#include "runtime/metrics.h"
#include "runtime/optimizer.h"
#include "runtime/process_groups.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string si(double v) {
  char buf[32];
  if (v >= 1e12) std::snprintf(buf, sizeof buf, "%.2f T", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f G", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f ", v);
  return buf;
}

// Sum of a double over a host communicator (float on the wire: the figures summed here are
// losses and squared norms, for which float's 1e-7 relative rounding is far inside 1e-5).
double sum_over(Communicator* c, double v) {
  if (!c || c->size() == 1) return v;
  float f = static_cast<float>(v);
  c->all_reduce(&f, 1, DType::kF32, ReduceOp::kSum);
  return f;
}

// Everything a run is made of, built once from the config.
struct Run {
  const Config& cfg;
  RunContext ctx;
  const World& w;
  int tensor = 1, pipeline = 1, data = 1;
  int threads = 1;
  GptDims dims;
  int micro = 0;         // sequences per micro-batch
  int global = 0;        // sequences per iteration
  int seq_len = 0;
  int accumulation = 0;  // micro-batches per iteration on this rank

  Run(const Config& c, const RunContext& x)
      : cfg(c), ctx(x), w(x.single_process ? solo_world() : world()) {
    validate_for_world(cfg, w.size);
    tensor = cfg.parallel.tensor;
    pipeline = cfg.parallel.pipeline;
    data = data_parallel_size(cfg, w.size);
    if (pipeline > 1) {
      throw InputError(cfg.source_file, "parallel.pipeline",
                       "1: pipeline parallelism is not in this build yet (got " +
                           std::to_string(pipeline) + ")");
    }
    threads = resolve_cpu_threads(cfg.train.threads, w.local_size);
    micro = cfg.train.micro_batch_size;
    global = cfg.train.global_batch_size;
    seq_len = cfg.model.seq_len;
    accumulation = microbatches_per_pipeline(cfg, w.size);
    // The tensor rank of this process, from the group layout (the same formula as the groups).
    const int tp_rank = group_layout(tensor, pipeline, data).coord(w.rank).tp;
    dims = gpt_dims(cfg.model, tensor, tp_rank, cfg.parallel.sequence_parallel);
  }

  MemoryPrediction predicted() const {
    MemoryPrediction m = GptModel::predict_memory(dims, micro, seq_len, threads);
    if (cfg.parallel.distributed_optimizer && data > 1) {
      m.optimizer /= data;
      m.gradients += m.gradients / data;  // the reduced shard beside the full buffer
    }
    return m;
  }

  void check_fits_in_memory() const {
    const MemoryPrediction m = predicted();
    const int64_t need = m.total() * w.local_size;
    const int64_t have = physical_memory_bytes();
    // Leave a tenth of the machine to the OS and the data; refuse before anything is allocated
    // rather than be killed by the OOM killer mid-run.
    if (have > 0 && need > have / 10 * 9) {
      throw InputError(cfg.source_file, "model",
                       "a model that fits in this machine's memory: training needs " +
                           format_bytes(need) + " (" + std::to_string(w.local_size) +
                           " rank(s) × " + format_bytes(m.total()) + "), the machine has " +
                           format_bytes(have));
    }
  }

  static const World& solo_world() {
    static const World solo = [] {
      World s;
      s.host = world().host;
      return s;
    }();
    return solo;
  }

  ProcessGroups groups() const {
    if (ctx.single_process) return make_single_process_groups(cfg.comm.timeout_s);
    return make_process_groups(tensor, pipeline, data,
                               w.size > 1 ? CommBackend::kMPI : CommBackend::kLocal,
                               cfg.comm.timeout_s);
  }
};

struct Batch {
  Tensor tokens;   // (B, S) i32
  Tensor targets;  // (B, S) i32
};

Batch load_batch(Backend& be, const DataSource& data, Split split, uint64_t iter, int64_t first,
                 int count, int seq_len) {
  std::vector<int32_t> in(static_cast<size_t>(count) * seq_len), tg(in.size());
  data.sample(split, iter, first, count, seq_len, in.data(), tg.data());
  Batch b;
  b.tokens = be.empty({count, seq_len}, MemCategory::kActivations, DType::kI32);
  b.targets = be.empty({count, seq_len}, MemCategory::kActivations, DType::kI32);
  be.upload(b.tokens, in.data());
  be.upload(b.targets, tg.data());
  return b;
}

std::vector<ParamSpan> param_spans(const GptModel& model) {
  std::vector<ParamSpan> s;
  for (const ParamInfo& p : model.param_infos()) {
    // A parameter replicated over the tensor group has the same gradient on every member: its
    // squares count once, on tensor rank 0.
    const bool counted = p.split != ParamSplit::kReplicated || model.dims().tp_rank == 0;
    s.push_back({p.offset, p.numel, p.decay, counted});
  }
  return s;
}

}  // namespace

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

void print_dry_run(const Config& cfg, const RunContext& ctx, std::ostream& os) {
  Run run(cfg, ctx);
  ProcessGroups g = run.groups();
  const std::string table = rank_table(g, "cpu");
  run.check_fits_in_memory();
  if (run.w.rank != 0) return;
  const GptDims& d = run.dims;
  int64_t n = 0;
  for (const ParamInfo& p : GptModel::layout(d)) n += p.numel;
  const GptDims whole = gpt_dims(cfg.model);
  int64_t real = 0;
  for (const ParamInfo& p : GptModel::layout(whole))
    real += p.rows_initialised >= 0 ? p.rows_initialised * p.shape[1] : p.numel;
  const FlopCount f = GptModel::flops_per_iteration(d, run.global, run.seq_len,
                                                    cfg.train.recompute == "full");
  const MemoryPrediction m = run.predicted();
  os << "model: " << d.L << " layers, hidden " << d.C << ", " << d.NH << " heads, ffn " << d.F
     << ", seq " << d.S << ", vocab " << d.V << " (padded " << d.Vp << ")\n";
  os << "parameters: " << real << " (" << si(static_cast<double>(real)) << "), " << n
     << " on each rank (tensor " << run.tensor << ")\n";
  os << "parallel: tensor " << run.tensor << " × pipeline " << run.pipeline << " × data "
     << run.data << " = " << run.w.size << " ranks"
     << (cfg.parallel.sequence_parallel ? ", sequence parallel" : "")
     << (cfg.parallel.distributed_optimizer ? ", distributed optimizer" : "") << "\n";
  os << "batch: global " << run.global << " sequences = " << run.accumulation
     << " micro-batches of " << run.micro << " × data " << run.data << " ("
     << static_cast<int64_t>(run.global) * run.seq_len << " tokens per iteration)\n";
  os << "FLOPs per iteration: model " << si(f.model) << "FLOP, hardware " << si(f.hardware)
     << "FLOP\n";
  os << "predicted memory per rank:\n";
  auto line = [&](const char* k, int64_t v) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "  %-12s %14lld B  %s\n", k, static_cast<long long>(v),
                  format_bytes(v).c_str());
    os << buf;
  };
  line("parameters", m.parameters);
  line("gradients", m.gradients);
  line("optimizer", m.optimizer);
  line("activations", m.activations);
  line("buffers", m.buffers);
  line("total", m.total());
  os << "ranks:\n" << table;
}

TrainResult run_training(const Config& cfg, const RunContext& ctx) {
  Run run(cfg, ctx);
  run.check_fits_in_memory();
  ProcessGroups groups = run.groups();
  std::unique_ptr<Backend> backend = make_backend(cfg.device, run.threads);
  Backend& be = *backend;
  std::unique_ptr<DataSource> data =
      make_data_source(cfg.data, cfg.train.seed, run.seq_len, cfg.source_file);
  if (data->vocab_size() > cfg.model.vocab_size) {
    throw InputError(cfg.source_file, "model.vocab_size",
                     "at least the data's vocabulary " + std::to_string(data->vocab_size()) +
                         ", got " + std::to_string(cfg.model.vocab_size));
  }
  const bool lead = run.w.rank == 0 && ctx.verbose;
  Communicator* dp = groups.dp.get();
  Communicator* mp = groups.mp.get();

  GptModel model(run.dims, be, cfg.train.seed, groups.tp.get());
  GradReducer reducer(be, dp, model.grads(), param_spans(model), cfg.parallel.bucket_mb,
                      cfg.parallel.distributed_optimizer);
  AdamW opt(be, cfg.optimizer, reducer.optimizer_segments());
  model.set_grad_ready_hook([&](int first, int last) { reducer.mark_ready(first, last); });
  std::unique_ptr<MetricsWriter> metrics;
  if (cfg.log.metrics && run.w.rank == 0)
    metrics = std::make_unique<MetricsWriter>(*cfg.log.metrics, false, cfg.source_file);

  TrainResult res;
  res.loss_floor = data->loss_floor(run.seq_len);
  const int iters = cfg.train.iterations;
  const double tokens_per_iter = static_cast<double>(run.global) * run.seq_len;
  const FlopCount flops = GptModel::flops_per_iteration(run.dims, run.global, run.seq_len,
                                                        cfg.train.recompute == "full");
  // Sequences of the global batch this data-parallel rank trains on.
  const int64_t dp_first = static_cast<int64_t>(groups.dp_rank) * (run.global / run.data);
  if (lead) {
    std::printf("strata train: %s\n", cfg.source_file.c_str());
    std::printf("  backend  %s; %d rank(s): tensor %d × pipeline %d × data %d%s%s\n",
                be.name().c_str(), run.w.size, run.tensor, run.pipeline, run.data,
                cfg.parallel.sequence_parallel ? ", sequence parallel" : "",
                reducer.sharded() ? ", distributed optimizer" : "");
    std::printf("  model    %d layers, hidden %d, %d heads, seq %d, vocab %d: %s parameters\n",
                run.dims.L, run.dims.C, run.dims.NH, run.dims.S, run.dims.V,
                si(static_cast<double>(model.num_real_parameters())).c_str());
    std::printf("  data     %s\n", data->describe().c_str());
    if (res.loss_floor)
      std::printf("  floor    best achievable loss at seq %d: %.4f nats/token (entropy rate %.4f)\n",
                  run.seq_len, *res.loss_floor, data->entropy_rate().value_or(0));
    std::printf("  batch    %d sequences × %d tokens = %d micro-batches of %d × data %d; "
                "%d iterations\n",
                run.global, run.seq_len, run.accumulation, run.micro, run.data, iters);
    std::fflush(stdout);
  }

  auto evaluate = [&]() {
    double sum = 0;
    for (int k = 0; k < cfg.train.eval_iters; ++k)
      for (int mb = 0; mb < run.accumulation; ++mb) {
        Batch b = load_batch(be, *data, Split::kVal, static_cast<uint64_t>(k),
                             dp_first + static_cast<int64_t>(mb) * run.micro, run.micro,
                             run.seq_len);
        sum += model.loss_sum(b.tokens, b.targets);
      }
    return sum_over(dp, sum) / (static_cast<double>(cfg.train.eval_iters) * tokens_per_iter);
  };

  const float grad_scale = static_cast<float>(1.0 / tokens_per_iter);
  int nonfinite_in_a_row = 0;
  double train_time = 0;
  const auto t_start = Clock::now();
  for (int it = 1; it <= iters; ++it) {
    const auto t0 = Clock::now();
    be.allocator().reset_peak();
    model.zero_grads();
    double loss_sum = 0;
    for (int mb = 0; mb < run.accumulation; ++mb) {
      // The data index is the optimizer step (0-based) and the slot in the global batch, so
      // any split of the batch into micro-batches or ranks sees the same sequences.
      Batch b = load_batch(be, *data, Split::kTrain, static_cast<uint64_t>(it - 1),
                           dp_first + static_cast<int64_t>(mb) * run.micro, run.micro,
                           run.seq_len);
      double s = 0;
      auto acts = model.forward(b.tokens, b.targets, &s);
      const bool last = mb == run.accumulation - 1;
      if (last) reducer.begin_iteration();
      model.backward(*acts, grad_scale, last);
      if (last) res.backward_end_s = reducer.since_begin_s();
      loss_sum += s;
    }
    reducer.finish();
    res.bucket_start_s = reducer.bucket_start_s();
    const double loss = sum_over(dp, loss_sum) / tokens_per_iter;
    double sq = reducer.local_sum_squares();
    if (reducer.sharded()) sq = sum_over(dp, sq);
    const double norm = std::sqrt(sum_over(mp, sq));
    const double lr = learning_rate(cfg.optimizer, iters, it);
    const bool finite = std::isfinite(loss) && std::isfinite(norm);
    if (finite) {
      nonfinite_in_a_row = 0;
      const double coef = clip_coefficient(norm, cfg.optimizer.grad_clip);
      if (coef < 1.0) be.scale_inplace(reducer.optimizer_grads(), static_cast<float>(coef));
      opt.step(model.params(), reducer.optimizer_grads(), lr);
      reducer.gather_params(model.params());
    } else {
      if (!cfg.train.skip_nonfinite)
        throw std::runtime_error("non-finite loss or gradient at iteration " +
                                 std::to_string(it) + " (train.skip_nonfinite is false)");
      if (++nonfinite_in_a_row >= 5)
        throw std::runtime_error("5 non-finite steps in a row (last at iteration " +
                                 std::to_string(it) + "): the run is diverging; lower "
                                 "optimizer.lr or check the data");
    }
    be.synchronize();
    const double step_s = seconds_since(t0);
    train_time += step_s;

    IterationMetrics m;
    m.iter = it;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.step_ms = step_s * 1e3;
    m.tokens_per_s = tokens_per_iter / step_s;
    m.tflops_per_gpu = flops.hardware / step_s / run.w.size / 1e12;
    m.bubble = 0.0;  // one stage: the compute never waits on a pipeline neighbour
    m.mem_peak_bytes = be.allocator().stats().total_peak;
    m.skipped = !finite;
    const bool eval_now = cfg.train.eval_interval > 0 &&
                          (it % cfg.train.eval_interval == 0 || it == iters);
    if (eval_now) {
      m.val_loss = evaluate();
      res.val_losses.emplace_back(it, *m.val_loss);
    }
    res.losses.push_back(loss);
    res.grad_norms.push_back(norm);
    res.skipped.push_back(!finite);
    if (metrics) metrics->write(m);
    if (lead && (it % cfg.log.interval == 0 || it == 1 || it == iters || eval_now)) {
      std::printf("iter %5d/%d | loss %.4f%s | lr %.2e | gnorm %.3f | %7.1f ms | %s tok/s | "
                  "%sFLOP/s | mem %s",
                  it, iters, loss, finite ? "" : " (skipped)", lr, norm, m.step_ms,
                  si(m.tokens_per_s).c_str(), si(flops.hardware / step_s).c_str(),
                  format_bytes(m.mem_peak_bytes).c_str());
      if (m.val_loss) std::printf(" | val %.4f", *m.val_loss);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  res.wall_s = seconds_since(t_start);
  res.tokens_per_s = train_time > 0 ? tokens_per_iter * iters / train_time : 0;
  res.memory = be.allocator().stats();
  res.final_params.resize(static_cast<size_t>(model.num_parameters()));
  be.download(res.final_params.data(), model.params());

  if (lead && iters > 0) {
    std::printf("done: %d iterations in %.1f s | final loss %.4f", iters, res.wall_s,
                res.losses.back());
    if (!res.val_losses.empty()) std::printf(" | val %.4f", res.val_losses.back().second);
    if (res.loss_floor) {
      const double last = res.val_losses.empty() ? res.losses.back() : res.val_losses.back().second;
      std::printf(" | floor %.4f (+%.4f nats)", *res.loss_floor, last - *res.loss_floor);
    }
    std::printf(" | %s tok/s | peak memory %s per rank\n", si(res.tokens_per_s).c_str(),
                format_bytes(res.memory.total_peak).c_str());
    std::fflush(stdout);
  }
  return res;
}

}  // namespace strata
