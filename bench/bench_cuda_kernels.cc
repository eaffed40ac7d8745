// bench_cuda_kernels.cc — throughput of the CUDA kernels (kernels/cuda) at the training shapes of
// GPT-2 124M and GPT 1.3B, each figure printed as a fraction of the GPU's roofline: GEMMs and
// attention in TFLOP/s against the dense bf16 tensor-core or fp32 CUDA-core peak, memory-bound
// ops in GB/s against the HBM bandwidth. The kernels are called directly, as the CUDA backend
// (runtime/backend/cuda/backend_cuda*.cu) calls them, without the runtime around them.
//
// Usage: bench_cuda_kernels [--models 124m,1.3b] [--types bf16,f32] [--reps N] [--json FILE]
//                           [--peak-bf16 TFLOPS] [--peak-fp32 TFLOPS] [--hbm-gbps GBPS]
//                           [--context-seqs 8192,16384,32768]
//
// Shapes (N = B·S tokens of one micro-batch):
//   124m  B=16 S=1024 C=768  NH=12 HS=64  ffn 3072, 12 layers
//   1.3b  B=4  S=2048 C=2048 NH=16 HS=128 ffn 8192, 24 layers (configs/bench/gpt-1.3b-gpu.json's
//         micro-batch)
//   Both: vocabulary 50257, padded to 50304 (a multiple of 128, as models/layers/embedding.cc
//   pads it): the LM-head GEMMs and the logits' row width use 50304, the cross-entropy reads the
//   50257 real columns. The optimizer rows run over every parameter of the model (124.5M, 1.31B,
//   padding rows included), one multi-tensor segment per parameter tensor.
//
// Precisions, as the model runs them (models/transformer/transformer.h):
//   f32   every operand f32. cuBLASLt computes in true fp32 (no TF32, gemm_lt.h), so GEMMs and
//         attention are held against the CUDA-core fp32 peak.
//   bf16  activations and the GEMMs' weight copy bf16 with f32 accumulation; weight gradients,
//         LayerNorm statistics and the optimizer state f32. Held against the bf16 dense peak.
//
// Figures:
//   GEMMs: 2·M·N·K FLOPs. Per linear layer the three GEMMs of the backend: forward (bias fused
//     in the epilogue), backward input (dinp += dout·w) and backward weight (dw += doutᵀ·inp,
//     dbias by the epilogue); plus the MLP's forward with the GELU fused (kGeluAuxBias), which
//     the backend does not use yet. An epilogue cuBLASLt has no kernel for is dropped and the
//     row says so (the backend then runs the separate bias kernel, timed in its own row).
//   Attention: the CAUSAL work, the S·(S+1)/2 query-key pairs a causal kernel must compute:
//     4·B·NH·HS·S(S+1)/2 FLOPs forward (q·kᵀ and p·v) and twice that backward (dv, dp, dq, dk;
//     the flash backward's recomputed q·kᵀ is overhead, not counted). That is about half the
//     dense-equivalent count of bench_kernels.cc and of Megatron's model FLOPs (which
//     tflops_per_gpu uses), so the % of peak is the fraction of the tensor cores really used.
//     FlashAttention-2's benchmark halves for causal too but counts the backward as 2.5× the
//     forward: multiply the bwd figure by 1.25 to compare with its published numbers.
//     Strata's rows run the kernels the backend runs: bf16 on tensor cores
//     (kernels/cuda/flash_attention_tc.cu), f32 on CUDA cores. The bf16 forward also runs with
//     each of its two tilings, 16 and 32 query rows per warp (rows "attention fwd 16 rows/warp"
//     and "... 32 rows/warp", left out of the summary): the measurement that decides the
//     default (on an H100: 32 at head size 128, 16 at 64).
//     In bf16 the same forward and backward also run on cuDNN's fused flash attention
//     (kernels/cuda/cudnn_attention.h, rows "attention fwd cudnn" / "attention bwd cudnn", the
//     same FLOP count; its backward recomputes the scores too). A shape cuDNN refuses prints
//     "unsupported: <cuDNN's reason>" instead of a time: not a failure. The first call of a
//     shape compiles cuDNN's kernels; that happens before the warm-up.
//   Memory-bound ops: GB/s of the bytes they must move at least — every array once, an
//     accumulated (+=) output read and written, embedding rows once per distinct token —
//     against the nominal HBM bandwidth. A device-to-device cudaMemcpy (read + write) is timed
//     first as the practical ceiling.
//
// Ring attention (--context-seqs S,...; off by default): context parallelism's blocks
//   (kernels/cuda/attention_block.h) at Llama-3.2-1B's attention (B=1, 32 query heads on 8
//   key/value heads of 64), for each S and c = 2, 4: the work of ONE context rank — its own S/c
//   rows under the causal mask, then c − 1 full blocks of S/c × S/(2c) (a key/value block from an
//   earlier rank: its first chunk), each merged by its log-sum-exp after the key/value
//   extraction; backward: delta, the same blocks into the f32 accumulators, the q/k/v gradient
//   assembled — beside the flash kernels on the unsplit sequence. Every rank does the same, so
//   c × the rank's time against the unsplit time is the blocks' cost per token (the issue's
//   target: within 10%), printed on a "ring c... per token" line; the ring's transfers are not
//   in it (bench/bench_context.cc measures those on the CPU). Kept out of the summary.
//
// Timing: cudaEvents around each call on one stream; the median of --reps (default 20) after 2
// warm-up calls (the first GEMM of a shape includes cuBLASLt's heuristic query). Accumulating
// kernels run on their own output again each repetition, which changes values, not work. Inputs
// are uniform random in a periodic 1M-element pattern (no kernel's work depends on the values).
//
// Peaks default to H100 SXM: bf16 dense 989 TFLOP/s, fp32 67 TFLOP/s, HBM 3350 GB/s (4800 GB/s
// when the device's name says H200); the flags override them.
//
// Never fails on time. Without a CUDA device it prints "no CUDA device" and exits 0; a buffer
// that cannot be allocated exits 1; a kernel that fails prints its error in its row and the rest
// go on. The last lines ("summary ...") give per model and precision the range of the GEMMs' and
// memory-bound ops' % of roofline and the attention's (cuDNN's in parentheses); scripts/gpu_check
// puts them in its summary.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/elem_type.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/gemm_bias.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/precision.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"

namespace kc = strata::kernels::cuda;
using kc::ElemType;

namespace {

constexpr int kWarmup = 2;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_cuda_kernels: %s\n", what.c_str());
  std::exit(1);
}

std::string cuda_error(cudaError_t e) {
  if (e == cudaSuccess) return "";
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}
std::string blas_error(cublasStatus_t s) {
  if (s == CUBLAS_STATUS_SUCCESS) return "";
  return std::string("cuBLASLt ") + cublasLtGetStatusName(s) + ": " + cublasLtGetStatusString(s);
}
std::string cudnn_error(cudnnStatus_t s) {
  if (s == CUDNN_STATUS_SUCCESS) return "";
  return std::string("cuDNN ") + cudnnGetErrorString(s);
}
// For setup (allocation, filling): a failure there leaves nothing to measure.
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cuda_error(e));
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1 << 30));
  return buf;
}

// A cudaMalloc'd block, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    const cudaError_t e = cudaMalloc(&ptr_, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) die("cudaMalloc of " + gib(double(bytes)) + ": " + cuda_error(e));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// n elements of type t.
size_t bytes_of(int64_t n, ElemType t) {
  return static_cast<size_t>(n) * kc::elem_size(t);
}

// dst (n of type t) = uniform values in [-scale, scale): one host-generated tile, cast on the
// device, then doubling device-to-device copies of what is already filled, so that gigabytes of
// logits or optimizer state take milliseconds instead of host-side generation.
void fill(void* dst, ElemType t, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  constexpr int64_t kTile = int64_t{1} << 20;
  const int64_t tile = std::min(n, kTile);
  if (tile <= 0) return;
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> host(static_cast<size_t>(tile));
  for (float& x : host) x = dist(gen);
  DeviceBuffer staging(bytes_of(tile, ElemType::kF32));
  check(cudaMemcpyAsync(staging.get(), host.data(), staging.bytes(), cudaMemcpyHostToDevice, s),
        "fill: upload");
  check(kc::cast(dst, t, staging.get(), ElemType::kF32, tile, s), "fill: cast");
  const size_t es = kc::elem_size(t);
  char* base = static_cast<char*>(dst);
  for (int64_t done = tile; done < n;) {
    const int64_t k = std::min(done, n - done);
    check(cudaMemcpyAsync(base + static_cast<size_t>(done) * es, base, static_cast<size_t>(k) * es,
                          cudaMemcpyDeviceToDevice, s),
          "fill: copy");
    done += k;
  }
  check(cudaStreamSynchronize(s), "fill");
}

void zero(const DeviceBuffer& b, cudaStream_t s) {
  check(cudaMemsetAsync(b.get(), 0, b.bytes(), s), "memset");
  check(cudaStreamSynchronize(s), "memset");
}

// Token ids uniform in [0, vocab) into dst (n), and the number of distinct ids among them.
int64_t fill_tokens(const DeviceBuffer& dst, int64_t n, int vocab, uint64_t seed, cudaStream_t s) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = dist(gen);
  // On the bench stream and waited for: a plain cudaMemcpy from pageable memory may return before
  // its DMA ends, and the bench stream does not wait for the default stream.
  check(cudaMemcpyAsync(dst.get(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                        s),
        "tokens: upload");
  check(cudaStreamSynchronize(s), "tokens: upload");
  std::sort(ids.begin(), ids.end());
  return std::unique(ids.begin(), ids.end()) - ids.begin();
}

// ---- timing --------------------------------------------------------------------------------

// An operation to time: enqueues its work on the bench stream, returns "" or an error message.
using Op = std::function<std::string()>;

struct Measured {
  double ms = 0;
  std::string error;
};

// Median event-timed milliseconds of op over `reps` calls, after kWarmup untimed ones.
class Timer {
 public:
  Timer(cudaStream_t stream, int reps) : stream_(stream), reps_(reps) {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  Measured run(const Op& op) {
    for (int i = 0; i < kWarmup; ++i) {
      std::string err = op();
      if (!err.empty()) return {0, err};
    }
    // An asynchronous fault of the warm-up shows here, not in the launch's status.
    std::string err = cuda_error(cudaStreamSynchronize(stream_));
    if (!err.empty()) return {0, err};
    std::vector<float> times;
    for (int i = 0; i < reps_; ++i) {
      cudaEventRecord(start_, stream_);
      err = op();
      cudaEventRecord(stop_, stream_);
      if (err.empty()) err = cuda_error(cudaEventSynchronize(stop_));
      if (!err.empty()) return {0, err};
      float ms = 0;
      err = cuda_error(cudaEventElapsedTime(&ms, start_, stop_));
      if (!err.empty()) return {0, err};
      times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return {times[times.size() / 2], ""};
  }

 private:
  cudaStream_t stream_;
  int reps_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// ---- rows ----------------------------------------------------------------------------------

enum class Unit { kFlops, kBytes };

struct Roofline {
  double bf16_tflops, fp32_tflops, hbm_gbps;
};

// One measured op.
struct Row {
  std::string model, op, type, shape;
  std::string group;  // "gemm", "attention", "memory", "latency", "optimizer", "reference"
  Unit unit = Unit::kFlops;
  double work = 0;        // FLOPs or bytes of one call
  double peak = 0;        // the roofline it is held against, FLOP/s or bytes/s
  std::string peak_name;  // "bf16", "fp32", "HBM"
  std::string note;
  std::string unsupported;  // why the library refuses this op here: printed, not timed
  Measured time;

  double rate() const { return time.ms > 0 ? work / (time.ms * 1e-3) : 0; }
  double percent() const { return peak > 0 ? 100.0 * rate() / peak : 0; }
};

void print_header(const Roofline& roof, int reps) {
  std::printf(
      "roofline: bf16 %.0f TFLOP/s (dense, tensor cores), fp32 %.0f TFLOP/s (CUDA cores, "
      "no TF32), HBM %.0f GB/s; median of %d after %d warm-up\n",
      roof.bf16_tflops, roof.fp32_tflops, roof.hbm_gbps, reps, kWarmup);
  std::printf("%-5s %-34s %-4s %-26s %12s %17s %7s\n", "model", "op", "type", "shape", "time",
              "rate", "of peak");
}

void print_row(const Row& r) {
  std::printf("%-5s %-34s %-4s %-26s ", r.model.c_str(), r.op.c_str(), r.type.c_str(),
              r.shape.c_str());
  if (!r.unsupported.empty()) {
    std::printf("unsupported: %s\n", r.unsupported.c_str());
  } else if (!r.time.error.empty()) {
    std::printf("FAILED: %s%s%s\n", r.time.error.c_str(), r.note.empty() ? "" : "; ",
                r.note.c_str());
  } else if (r.unit == Unit::kFlops) {
    std::printf("%9.3f ms %9.1f TFLOP/s %6.1f%% %s%s%s\n", r.time.ms, r.rate() / 1e12, r.percent(),
                r.peak_name.c_str(), r.note.empty() ? "" : "  ", r.note.c_str());
  } else {
    std::printf("%9.3f ms %9.1f GB/s    %6.1f%% %s%s%s\n", r.time.ms, r.rate() / 1e9, r.percent(),
                r.peak_name.c_str(), r.note.empty() ? "" : "  ", r.note.c_str());
  }
  std::fflush(stdout);  // a run cut short by a time limit keeps every finished row
}

// ---- shapes --------------------------------------------------------------------------------

// GPT models (LayerNorm, GELU MLP, multi-head attention: KVH = NH), and a Llama-family shape
// (llama: RMSNorm, RoPE, SwiGLU MLP of width F, grouped-query attention with KVH key/value heads),
// of which only the attention and the Llama-family row-wise kernels are timed.
struct Model {
  std::string name;
  int B, S, C, NH, KVH, F, L, V, Vp;
  bool llama = false;
  int HS() const { return C / NH; }
  int64_t N() const { return int64_t{B} * S; }
};

const Model kModels[] = {
    {"124m", 16, 1024, 768, 12, 12, 3072, 12, 50257, 50304},
    {"1.3b", 4, 2048, 2048, 16, 16, 8192, 24, 50257, 50304},
    // Llama-3-8B's layer: HS 128, 32 query and 8 key/value heads, F 14336.
    {"llama3-8b", 2, 4096, 4096, 32, 8, 14336, 32, 128256, 128256, true},
};

// One parameter tensor of the model, for the optimizer's segment list.
struct ParamTensor {
  int64_t n;
  bool decay;  // weight matrices decay; biases and LayerNorm parameters do not
};

// The GPT parameter tensors (models/gpt/arch.cc's layout, tied embeddings, padded vocabulary).
std::vector<ParamTensor> param_tensors(const Model& m) {
  const int64_t C = m.C, F = m.F;
  std::vector<ParamTensor> t = {{int64_t{m.Vp} * C, true}, {int64_t{m.S} * C, true}};
  for (int l = 0; l < m.L; ++l) {
    const std::vector<ParamTensor> layer = {
        {C, false},        {C, false},      // ln1 weight, bias
        {3 * C * C, true}, {3 * C, false},  // qkv
        {C * C, true},     {C, false},      // attention projection
        {C, false},        {C, false},      // ln2
        {F * C, true},     {F, false},      // fc
        {C * F, true},     {C, false},      // fc projection
    };
    t.insert(t.end(), layer.begin(), layer.end());
  }
  t.push_back({C, false});  // final LayerNorm
  t.push_back({C, false});
  return t;
}

std::string gemm_shape(int M, int N, int K) {
  return "M" + std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K);
}
std::string nc_shape(int64_t N, int64_t C) {
  return "N" + std::to_string(N) + " C" + std::to_string(C);
}

// ---- the bench -----------------------------------------------------------------------------

class Bench {
 public:
  Bench(const Roofline& roof, int reps)
      : roof_(roof),
        stream_(make_stream()),
        timer_(stream_, reps),
        workspace_(kc::GemmLt::kDefaultWorkspaceBytes),
        lt_(workspace_.get(), workspace_.bytes()) {
    if (lt_.status() != CUBLAS_STATUS_SUCCESS) die("cublasLtCreate: " + blas_error(lt_.status()));
  }
  ~Bench() {
    cudnn_.reset();  // its handle was last set to stream_
    cudaStreamDestroy(stream_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  const std::vector<Row>& rows() const { return rows_; }

  void memcpy_reference();
  void linears(const Model& m, ElemType t);
  void attention(const Model& m, ElemType t);
  void ring_attention(int S, int c, ElemType t);
  void rowwise(const Model& m, ElemType t);
  void llama_rowwise(const Model& m, ElemType t);
  void cross_entropy(const Model& m, ElemType t);
  void optimizer(const Model& m);

 private:
  static cudaStream_t make_stream() {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }

  Row row(const Model& m, const std::string& op, ElemType t, const std::string& shape) const {
    Row r;
    r.model = m.name;
    r.op = op;
    r.type = kc::to_string(t);
    r.shape = shape;
    return r;
  }
  void flops(Row& r, double work, ElemType t) const {
    r.group = r.op.rfind("attention", 0) == 0 ? "attention" : "gemm";
    r.unit = Unit::kFlops;
    r.work = work;
    const bool bf16 = t == ElemType::kBF16;
    r.peak = (bf16 ? roof_.bf16_tflops : roof_.fp32_tflops) * 1e12;
    r.peak_name = bf16 ? "bf16" : "fp32";
  }
  void bytes(Row& r, double work, const char* group = "memory") const {
    r.group = group;
    r.unit = Unit::kBytes;
    r.work = work;
    r.peak = roof_.hbm_gbps * 1e9;
    r.peak_name = "HBM";
  }
  void measure(Row r, const Op& op) {
    r.time = timer_.run(op);
    print_row(r);
    rows_.push_back(std::move(r));
  }
  // A row that is not timed: the library refuses the op here, for `why`.
  void unsupported(Row r, const std::string& why) {
    r.unsupported = why;
    print_row(r);
    rows_.push_back(std::move(r));
  }
  // A GEMM row: when cuBLASLt has no kernel for g's epilogue, the GEMM alone (noted).
  void gemm(Row r, kc::Gemm g) {
    cublasStatus_t st = lt_.run(g, stream_);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && g.epilogue != kc::GemmEpilogue::kNone) {
      g.epilogue = kc::GemmEpilogue::kNone;
      r.note = "epilogue not supported by cuBLASLt here: GEMM alone";
      st = lt_.run(g, stream_);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      r.time.error = blas_error(st);
      if (st == CUBLAS_STATUS_NOT_SUPPORTED) r.note = "the backend widens these operands to f32";
      print_row(r);
      rows_.push_back(std::move(r));
      return;
    }
    measure(std::move(r), [this, g] { return blas_error(lt_.run(g, stream_)); });
  }

  Roofline roof_;
  cudaStream_t stream_;
  Timer timer_;
  DeviceBuffer workspace_;  // cuBLASLt's, 32 MiB
  kc::GemmLt lt_;
  // cuDNN's attention; a failed cudnnCreate shows per shape, as supports()'s reason.
  std::unique_ptr<kc::CudnnAttention> cudnn_ = std::make_unique<kc::CudnnAttention>();
  std::vector<Row> rows_;
};

void Bench::memcpy_reference() {
  const size_t n = size_t{1} << 30;
  DeviceBuffer src(n), dst(n);
  zero(src, stream_);
  Row r;
  r.model = "-";
  r.op = "memcpy d2d (ceiling reference)";
  r.type = "-";
  r.shape = "1 GiB";
  bytes(r, 2.0 * double(n), "reference");  // read + write
  measure(std::move(r), [&] {
    return cuda_error(cudaMemcpyAsync(dst.get(), src.get(), n, cudaMemcpyDeviceToDevice, stream_));
  });
}

// The linear layers of one block and the LM head, as runtime/backend/cuda/backend_cuda_gemm.cu
// runs them:
//   forward          out (N, out) = inp (N, in) · wᵀ + bias        (bias epilogue)
//   backward input   dinp (N, in) = dout (N, out) · w (out, in)     (assigned: beta 0)
//   backward weight  dw (out, in) += doutᵀ · inp, dbias = Σ dout   (bias-gradient epilogue)
// Weight gradients are f32 in both precisions (the model's gradients are).
void Bench::linears(const Model& m, ElemType t) {
  struct Linear {
    const char* name;
    int in, out;
    bool bias;
    bool gelu;        // also timed with the GELU fused into the forward's epilogue
    bool after_gelu;  // also timed with the backward input carried through GELU (DGELU)
    bool residual;    // also timed adding the residual stream in the GEMM (beta 1, C_in)
  };
  const Linear layers[] = {{"qkv", m.C, 3 * m.C, true, false, false, false},
                           {"attn proj", m.C, m.C, true, false, false, true},
                           {"fc", m.C, m.F, true, true, false, false},
                           {"fc proj", m.F, m.C, true, false, true, true},
                           {"lm head (tied wte)", m.C, m.Vp, false, false, false, false}};
  const int N = static_cast<int>(m.N());
  for (const Linear& l : layers) {
    DeviceBuffer inp(bytes_of(int64_t{N} * l.in, t));                  // (N, in)
    DeviceBuffer w(bytes_of(int64_t{l.out} * l.in, t));                // (out, in)
    DeviceBuffer bias(bytes_of(l.out, t));                             // (out)
    DeviceBuffer out(bytes_of(int64_t{N} * l.out, t));                 // (N, out)
    DeviceBuffer dout(bytes_of(int64_t{N} * l.out, t));                // (N, out)
    DeviceBuffer dinp(bytes_of(int64_t{N} * l.in, t));                 // (N, in)
    DeviceBuffer dw(bytes_of(int64_t{l.out} * l.in, ElemType::kF32));  // (out, in)
    DeviceBuffer db(bytes_of(l.out, ElemType::kF32));                  // (out)
    fill(inp.get(), t, int64_t{N} * l.in, 1, 1.f, stream_);
    fill(w.get(), t, int64_t{l.out} * l.in, 2, 0.05f, stream_);
    fill(bias.get(), t, l.out, 3, 0.1f, stream_);
    fill(dout.get(), t, int64_t{N} * l.out, 4, 1e-3f, stream_);
    zero(dinp, stream_);
    zero(dw, stream_);
    const double fl = 2.0 * N * double(l.in) * l.out;

    kc::Gemm fwd;
    fwd.trans_b = true;
    fwd.M = N, fwd.N = l.out, fwd.K = l.in;
    fwd.A = inp.get(), fwd.lda = l.in;
    fwd.B = w.get(), fwd.ldb = l.in;
    fwd.ab_type = t;
    fwd.C = out.get(), fwd.ldc = l.out, fwd.c_type = t;
    if (l.bias) {
      fwd.epilogue = kc::GemmEpilogue::kBias;
      fwd.bias = bias.get();
      fwd.bias_type = t;
    }
    Row r = row(m, std::string("gemm fwd ") + l.name + (l.bias ? " +bias" : ""), t,
                gemm_shape(fwd.M, fwd.N, fwd.K));
    flops(r, fl, t);
    gemm(r, fwd);

    if (l.gelu) {  // the pre-GELU values kept in aux for the backward
      DeviceBuffer aux(bytes_of(int64_t{N} * l.out, t));  // (N, F)
      kc::Gemm g = fwd;
      g.epilogue = kc::GemmEpilogue::kGeluAuxBias;
      g.aux = aux.get();
      g.ld_aux = l.out;
      r = row(m, std::string("gemm fwd ") + l.name + " +bias+gelu", t, gemm_shape(g.M, g.N, g.K));
      flops(r, fl, t);
      gemm(r, g);
    }

    // out = inp · wᵀ + bias + residual, as the model runs the projections: compare with the
    // row above plus the "residual add" row, the two ops this one replaces.
    if (l.residual) {
      DeviceBuffer residual(bytes_of(int64_t{N} * l.out, t));  // (N, out)
      fill(residual.get(), t, int64_t{N} * l.out, 6, 1.f, stream_);
      kc::Gemm g = fwd;
      g.beta = 1.f;
      g.C_in = residual.get();
      r = row(m, std::string("gemm fwd ") + l.name + " +bias+residual", t,
              gemm_shape(g.M, g.N, g.K));
      flops(r, fl, t);
      gemm(r, g);
    }

    kc::Gemm bin;
    bin.M = N, bin.N = l.in, bin.K = l.out;
    bin.A = dout.get(), bin.lda = l.out;
    bin.B = w.get(), bin.ldb = l.in;
    bin.ab_type = t;
    bin.C = dinp.get(), bin.ldc = l.in, bin.c_type = t;
    r = row(m, std::string("gemm bwd-in ") + l.name, t, gemm_shape(bin.M, bin.N, bin.K));
    flops(r, fl, t);
    gemm(r, bin);

    if (l.after_gelu) {  // d(pre-GELU) straight from the GEMM, reading the saved pre-activation
      DeviceBuffer aux(bytes_of(int64_t{N} * l.in, t));  // (N, F)
      fill(aux.get(), t, int64_t{N} * l.in, 5, 1.f, stream_);
      kc::Gemm g = bin;
      g.epilogue = kc::GemmEpilogue::kDGelu;
      g.aux = aux.get();
      g.ld_aux = l.in;
      r = row(m, std::string("gemm bwd-in ") + l.name + " +dgelu", t, gemm_shape(g.M, g.N, g.K));
      flops(r, fl, t);
      gemm(r, g);
    }

    kc::Gemm bw;
    bw.trans_a = true;
    bw.M = l.out, bw.N = l.in, bw.K = N;
    bw.A = dout.get(), bw.lda = l.out;
    bw.B = inp.get(), bw.ldb = l.in;
    bw.ab_type = t;
    bw.C = dw.get(), bw.ldc = l.in, bw.c_type = ElemType::kF32;
    bw.beta = 1.f;
    if (l.bias) {
      bw.epilogue = kc::GemmEpilogue::kBiasGradA;
      bw.bias_grad = db.get();
    }
    r = row(m, std::string("gemm bwd-w ") + l.name + (l.bias ? " +dbias" : ""), t,
            gemm_shape(bw.M, bw.N, bw.K));
    flops(r, fl, t);
    gemm(r, bw);
  }
}

void Bench::attention(const Model& m, ElemType t) {
  const int B = m.B, S = m.S, NH = m.NH, KVH = m.KVH, HS = m.HS();
  const int64_t nqkv = m.N() * (NH + 2 * KVH) * HS, nout = m.N() * m.C;
  DeviceBuffer qkv(bytes_of(nqkv, t));                              // (B, S, NH + 2·KVH, HS)
  DeviceBuffer out(bytes_of(nout, t));                              // (B, S, NH, HS)
  DeviceBuffer lse(bytes_of(int64_t{B} * NH * S, ElemType::kF32));  // (B, NH, S)
  DeviceBuffer dout(bytes_of(nout, t));                             // (B, S, NH, HS)
  DeviceBuffer dqkv(bytes_of(nqkv, t));                             // (B, S, NH + 2·KVH, HS)
  DeviceBuffer scratch(kc::flash_attention_backward_scratch_bytes(B, S, NH, KVH, HS));
  fill(qkv.get(), t, nqkv, 10, 1.f, stream_);
  fill(dout.get(), t, nout, 11, 1.f, stream_);
  zero(dqkv, stream_);
  const double pairs = 0.5 * double(S) * (S + 1);  // causal (query, key) pairs per head
  const double fl = 4.0 * B * NH * HS * pairs;
  const std::string shape =
      "B" + std::to_string(B) + " S" + std::to_string(S) + " NH" + std::to_string(NH) +
      (KVH != NH ? " KVH" + std::to_string(KVH) : std::string()) + " HS" + std::to_string(HS);
  Row r = row(m, "attention fwd (causal)", t, shape);
  flops(r, fl, t);
  measure(r, [&] {
    return cuda_error(kc::flash_attention_forward(out.get(), lse.f32(), qkv.get(), t, B, S, NH, KVH,
                                                  HS, stream_));
  });
  r = row(m, "attention bwd (causal)", t, shape);  // uses the forward's out and lse
  flops(r, 2 * fl, t);
  measure(r, [&] {
    return cuda_error(kc::flash_attention_backward(dqkv.get(), dout.get(), qkv.get(), out.get(),
                                                   lse.f32(), t, B, S, NH, KVH, HS, scratch.get(),
                                                   stream_));
  });
  if (t != ElemType::kBF16) return;  // cuDNN's flash attention is fp16/bf16 only
  for (const int rows : {16, 32}) {
    // The forward's two tilings side by side (the default is 32 query rows per warp above head
    // size 64, else 16): 16 rows per warp, more blocks per SM; 32, half the shared-memory reads
    // per product. Kept out of the summary's attention figures.
    Row v = row(m, "attention fwd " + std::to_string(rows) + " rows/warp", t, shape);
    flops(v, fl, t);
    v.group = "variant";
    measure(v, [&] {
      return cuda_error(kc::flash_attention_forward_bf16_warp_rows(
          out.get(), lse.f32(), qkv.get(), B, S, NH, KVH, HS, rows, stream_));
    });
  }
  // The same on cuDNN; its backward uses its own forward's out and lse, and overwrites dqkv.
  Row cf = row(m, "attention fwd cudnn", t, shape);
  flops(cf, fl, t);
  Row cb = row(m, "attention bwd cudnn", t, shape);
  flops(cb, 2 * fl, t);
  std::string why;
  if (cudnn_->supports(t, B, S, NH, KVH, HS, &why) != CUDNN_STATUS_SUCCESS) {
    unsupported(cf, why);
    unsupported(cb, why);
    return;
  }
  DeviceBuffer cudnn_ws(std::max(cudnn_->forward_workspace_bytes(t, B, S, NH, KVH, HS),
                                 cudnn_->backward_workspace_bytes(t, B, S, NH, KVH, HS)));
  measure(cf, [&] {
    return cudnn_error(cudnn_->forward(out.get(), lse.f32(), qkv.get(), t, B, S, NH, KVH, HS,
                                       cudnn_ws.get(), stream_));
  });
  measure(cb, [&] {
    return cudnn_error(cudnn_->backward(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.f32(), t,
                                        B, S, NH, KVH, HS, cudnn_ws.get(), stream_));
  });
}

// One context rank's ring attention blocks against the unsplit flash kernels (the top of the file).
void Bench::ring_attention(int S, int c, ElemType t) {
  const int B = 1, NH = 32, KVH = 8, HS = 64, Sl = S / c, half = Sl / 2;
  const Model m{"llama3.2-1b", B, S, NH * HS, NH, KVH, 8192, 16, 128256, 128256, true};
  const int64_t W = (NH + 2 * KVH) * HS, Q = NH * HS, KV = 2 * KVH * HS;
  const std::string shape = "B1 S" + std::to_string(S) + " NH32 KVH8 HS64";
  const std::string ring = "ring c" + std::to_string(c);
  const double pairs = 0.5 * double(S) * (S + 1), fl = 4.0 * B * NH * HS * pairs;
  // The unsplit sequence: forward + backward in one row.
  double unsplit = 0;
  {
    DeviceBuffer qkv(bytes_of(B * S * W, t)), out(bytes_of(B * S * Q, t));
    DeviceBuffer lse(bytes_of(int64_t{B} * NH * S, ElemType::kF32)), dout(bytes_of(B * S * Q, t));
    DeviceBuffer dqkv(bytes_of(B * S * W, t));
    DeviceBuffer scratch(kc::flash_attention_backward_scratch_bytes(B, S, NH, KVH, HS));
    fill(qkv.get(), t, B * S * W, 20, 1.f, stream_);
    fill(dout.get(), t, B * S * Q, 21, 1.f, stream_);
    Row r = row(m, "attention fwd+bwd unsplit", t, shape);
    flops(r, 3 * fl, t);
    r.group = "variant";
    measure(r, [&] {
      const std::string e = cuda_error(kc::flash_attention_forward(out.get(), lse.f32(), qkv.get(),
                                                                   t, B, S, NH, KVH, HS, stream_));
      if (!e.empty()) return e;
      return cuda_error(kc::flash_attention_backward(dqkv.get(), dout.get(), qkv.get(), out.get(),
                                                     lse.f32(), t, B, S, NH, KVH, HS, scratch.get(),
                                                     stream_));
    });
    unsplit = rows_.back().time.ms;
  }
  // One rank's rows: its q/k/v and a received key/value block (stand-ins: the rank's own).
  DeviceBuffer qkv(bytes_of(B * Sl * W, t)), kv(bytes_of(B * Sl * KV, t));
  DeviceBuffer out(bytes_of(B * Sl * Q, t)), out_b(bytes_of(B * Sl * Q, t));
  DeviceBuffer lse(bytes_of(int64_t{B} * NH * Sl, ElemType::kF32));
  DeviceBuffer lse_b(bytes_of(int64_t{B} * NH * Sl, ElemType::kF32));
  DeviceBuffer delta(bytes_of(int64_t{B} * NH * Sl, ElemType::kF32));
  DeviceBuffer dout(bytes_of(B * Sl * Q, t)), dqkv(bytes_of(B * Sl * W, t));
  DeviceBuffer dq(bytes_of(B * Sl * Q, ElemType::kF32)), dkv(bytes_of(B * Sl * KV, ElemType::kF32));
  fill(qkv.get(), t, B * Sl * W, 22, 1.f, stream_);
  fill(dout.get(), t, B * Sl * Q, 23, 1.f, stream_);
  zero(dq, stream_);
  zero(dkv, stream_);
  kc::FlashRows own;  // the rank's S/c rows, causal, keys inside the q/k/v
  own.B = B;
  own.Sq = own.Sk = Sl;
  own.NH = NH;
  own.KVH = KVH;
  own.HS = HS;
  own.q_ld = W;
  own.q_batch = W * Sl;
  own.k_ld = W;
  own.k_batch = W * Sl;
  own.o_ld = Q;
  own.o_batch = Q * Sl;
  own.lse_ld = Sl;
  own.causal = true;
  kc::FlashRows step = own;  // every query row against a received block's first chunk
  step.Sk = half;
  step.k_ld = KV;
  step.k_batch = KV * Sl;
  step.causal = false;
  const size_t es = kc::elem_size(t);
  const void* own_k = static_cast<const char*>(qkv.get()) + Q * es;
  kc::FlashRows step_bwd = step;  // the backward's keys: the extracted block (dkv's layout)
  kc::FlashRows own_bwd = own;
  own_bwd.k_ld = KV;
  own_bwd.k_batch = KV * Sl;
  Row f = row(m, "attention fwd " + ring + " (one rank)", t, shape);
  flops(f, fl / c, t);
  f.group = "variant";
  measure(f, [&] {
    std::string e =
        cuda_error(kc::attention_kv_extract(kv.get(), qkv.get(), t, B * Sl, W, Q, stream_));
    if (e.empty())
      e = cuda_error(
          kc::attention_block_forward(out.get(), lse.f32(), qkv.get(), own_k, t, own, stream_));
    for (int k = 1; k < c && e.empty(); ++k) {
      e = cuda_error(kc::attention_block_forward(out_b.get(), lse_b.f32(), qkv.get(), kv.get(), t,
                                                 step, stream_));
      if (e.empty())
        e = cuda_error(kc::attention_block_merge(out.get(), lse.f32(), out_b.get(), lse_b.f32(), t,
                                                 B, Sl, NH, HS, 0, Sl, stream_));
    }
    return e;
  });
  const double fwd = rows_.back().time.ms;
  Row b = row(m, "attention bwd " + ring + " (one rank)", t, shape);
  flops(b, 2 * fl / c, t);
  b.group = "variant";
  measure(b, [&] {
    std::string e = cuda_error(
        kc::attention_block_delta(delta.f32(), dout.get(), out.get(), t, B, Sl, NH, HS, stream_));
    if (e.empty())
      e = cuda_error(kc::attention_block_backward(dq.f32(), dkv.f32(), dout.get(), qkv.get(),
                                                  kv.get(), lse.f32(), delta.f32(), t, own_bwd,
                                                  stream_));
    for (int k = 1; k < c && e.empty(); ++k)
      e = cuda_error(kc::attention_block_backward(dq.f32(), dkv.f32(), dout.get(), qkv.get(),
                                                  kv.get(), lse.f32(), delta.f32(), t, step_bwd,
                                                  stream_));
    if (e.empty())
      e = cuda_error(
          kc::attention_qkv_assemble(dqkv.get(), dq.f32(), dkv.f32(), t, B * Sl, Q, KV, stream_));
    return e;
  });
  const double bwd = rows_.back().time.ms;
  if (unsplit > 0 && fwd > 0 && bwd > 0)
    std::printf(
        "%s S=%d %s: per token %.3f x the unsplit flash kernels (c x one rank's %.3f ms "
        "fwd + %.3f ms bwd against %.3f ms)\n",
        ring.c_str(), S, kc::to_string(t), c * (fwd + bwd) / unsplit, fwd, bwd, unsplit);
}

// RMSNorm, RoPE, the query and key heads' RMSNorm (Qwen3) and SwiGLU of a Llama-family layer:
// memory-bound.
void Bench::llama_rowwise(const Model& m, ElemType t) {
  const int64_t N = m.N();
  const int C = m.C, F = m.F, NH = m.NH, KVH = m.KVH, HS = m.HS();
  const double e = double(kc::elem_size(t)), f4 = 4.0;
  {
    const int64_t n = N * C;
    DeviceBuffer inp(bytes_of(n, t)), out(bytes_of(n, t)), dout(bytes_of(n, t)),
        dinp(bytes_of(n, t));                                           // (N, C)
    DeviceBuffer w(bytes_of(C, t)), rstd(bytes_of(N, ElemType::kF32));  // (C), (N)
    DeviceBuffer dw(bytes_of(C, ElemType::kF32));                       // (C)
    fill(inp.get(), t, n, 50, 1.f, stream_);
    fill(dout.get(), t, n, 51, 1.f, stream_);
    fill(w.get(), t, C, 52, 1.f, stream_);
    zero(dinp, stream_);
    zero(dw, stream_);
    // forward: inp read, out written, rstd written, weight read.
    Row r = row(m, "rmsnorm fwd", t, nc_shape(N, C));
    bytes(r, 2 * n * e + N * f4 + C * e);
    measure(r, [&] {
      return cuda_error(kc::rmsnorm_forward(out.get(), rstd.f32(), inp.get(), t, w.get(), t, 1e-5f,
                                            N, C, stream_));
    });
    // backward: dout, inp read; dinp read+written; rstd, weight read; dw read+written.
    r = row(m, "rmsnorm bwd", t, nc_shape(N, C));
    bytes(r, 4 * n * e + N * f4 + C * e + 2 * C * f4);
    measure(r, [&] {
      return cuda_error(kc::rmsnorm_backward(dinp.get(), dw.f32(), dout.get(), inp.get(), t,
                                             w.get(), t, rstd.f32(), N, C, stream_));
    });
  }
  {
    // RoPE in place on the query and key heads of qkv; the table (S, HS) f32 read.
    const int64_t rotated = N * (NH + KVH) * HS;
    DeviceBuffer qkv(bytes_of(N * (NH + 2 * KVH) * HS, t));             // (B, S, NH + 2·KVH, HS)
    DeviceBuffer cos_sin(bytes_of(int64_t{m.S} * HS, ElemType::kF32));  // (S, HS)
    fill(qkv.get(), t, N * (NH + 2 * KVH) * HS, 53, 1.f, stream_);
    fill(cos_sin.get(), ElemType::kF32, int64_t{m.S} * HS, 54, 1.f, stream_);
    const std::string shape = "B" + std::to_string(m.B) + " S" + std::to_string(m.S) + " NH" +
                              std::to_string(NH) + " KVH" + std::to_string(KVH) + " HS" +
                              std::to_string(HS);
    Row r = row(m, "rope fwd", t, shape);
    bytes(r, 2 * rotated * e + double(m.S) * HS * f4);
    measure(r, [&] {
      return cuda_error(
          kc::rope_forward(qkv.get(), t, cos_sin.f32(), m.B, m.S, NH, KVH, HS, stream_));
    });
    r = row(m, "rope bwd", t, shape);
    bytes(r, 2 * rotated * e + double(m.S) * HS * f4);
    measure(r, [&] {
      return cuda_error(
          kc::rope_backward(qkv.get(), t, cos_sin.f32(), m.B, m.S, NH, KVH, HS, stream_));
    });
    // Qwen3's q_norm and k_norm on the same heads, in place: N·(NH + KVH) rows of HS, their f32
    // rstd, the two (HS) weights in t and their f32 gradients. Forward: heads read and written,
    // rstd written. Backward: dqkv's heads read and written, x's heads read, rstd read, the
    // weight gradients read and written (the least a kernel must move; the weight-gradient
    // kernels read dqkv and x once more).
    const double stats = double(N) * (NH + KVH);
    DeviceBuffer x(bytes_of(N * (NH + 2 * KVH) * HS, t));  // (B, S, NH + 2·KVH, HS)
    DeviceBuffer qk_rstd(bytes_of(N * (NH + KVH), ElemType::kF32));
    DeviceBuffer qw(bytes_of(HS, t)), kw(bytes_of(HS, t));                              // (HS)
    DeviceBuffer dqw(bytes_of(HS, ElemType::kF32)), dkw(bytes_of(HS, ElemType::kF32));  // (HS)
    fill(x.get(), t, N * (NH + 2 * KVH) * HS, 57, 1.f, stream_);
    fill(qw.get(), t, HS, 58, 1.f, stream_);
    fill(kw.get(), t, HS, 59, 1.f, stream_);
    zero(dqw, stream_);
    zero(dkw, stream_);
    r = row(m, "qk_rmsnorm fwd", t, shape);
    bytes(r, 2 * rotated * e + stats * f4 + 2 * HS * e);
    measure(r, [&] {
      return cuda_error(kc::qk_rmsnorm_forward(qkv.get(), t, qk_rstd.f32(), qw.get(), kw.get(), t,
                                               1e-6f, N, NH, KVH, HS, stream_));
    });
    r = row(m, "qk_rmsnorm bwd", t, shape);
    bytes(r, 3 * rotated * e + stats * f4 + 2 * HS * e + 4 * HS * f4);
    measure(r, [&] {
      return cuda_error(kc::qk_rmsnorm_backward(qkv.get(), dqw.f32(), dkw.f32(), x.get(), t,
                                                qw.get(), kw.get(), t, qk_rstd.f32(), N, NH, KVH,
                                                HS, stream_));
    });
  }
  {
    const int64_t n = N * F;  // the MLP's hidden activation (N, F); gate_up (N, 2F)
    DeviceBuffer gate_up(bytes_of(2 * n, t)), dgate_up(bytes_of(2 * n, t));
    DeviceBuffer out(bytes_of(n, t)), dout(bytes_of(n, t));
    fill(gate_up.get(), t, 2 * n, 55, 3.f, stream_);
    fill(dout.get(), t, n, 56, 1.f, stream_);
    Row r = row(m, "swiglu fwd", t, nc_shape(N, F));  // gate_up read, out written
    bytes(r, 3 * n * e);
    measure(r, [&] {
      return cuda_error(kc::swiglu_forward(out.get(), gate_up.get(), t, N, F, stream_));
    });
    r = row(m, "swiglu bwd", t, nc_shape(N, F));  // gate_up, dout read; dgate_up written
    bytes(r, 5 * n * e);
    measure(r, [&] {
      return cuda_error(
          kc::swiglu_backward(dgate_up.get(), dout.get(), gate_up.get(), t, N, F, stream_));
    });
  }
}

// LayerNorm, GELU, the residual add, the bias gradient and the embedding: memory-bound.
void Bench::rowwise(const Model& m, ElemType t) {
  const int64_t N = m.N();
  const int C = m.C, F = m.F;
  const double e = double(kc::elem_size(t)), f4 = 4.0;
  {
    const int64_t n = N * C;
    DeviceBuffer inp(bytes_of(n, t)), out(bytes_of(n, t)), dout(bytes_of(n, t)),
        dinp(bytes_of(n, t));                                                           // (N, C)
    DeviceBuffer w(bytes_of(C, t)), b(bytes_of(C, t));                                  // (C)
    DeviceBuffer mean(bytes_of(N, ElemType::kF32)), rstd(bytes_of(N, ElemType::kF32));  // (N)
    DeviceBuffer dw(bytes_of(C, ElemType::kF32)), db(bytes_of(C, ElemType::kF32));      // (C)
    fill(inp.get(), t, n, 20, 1.f, stream_);
    fill(dout.get(), t, n, 21, 1.f, stream_);
    fill(w.get(), t, C, 22, 1.f, stream_);
    fill(b.get(), t, C, 23, 1.f, stream_);
    zero(dinp, stream_);
    zero(dw, stream_);
    zero(db, stream_);
    // forward: inp read, out written, mean/rstd written, weight/bias read.
    Row r = row(m, "layernorm fwd", t, nc_shape(N, C));
    bytes(r, 2 * n * e + 2 * N * f4 + 2 * C * e);
    measure(r, [&] {
      return cuda_error(kc::layernorm_forward(out.get(), mean.f32(), rstd.f32(), inp.get(), t,
                                              w.get(), b.get(), t, N, C, 1e-5f, stream_));
    });
    // backward: dout, inp read; dinp read+written; mean/rstd, weight read; dw/db read+written.
    r = row(m, "layernorm bwd", t, nc_shape(N, C));
    bytes(r, 4 * n * e + 2 * N * f4 + C * e + 4 * C * f4);
    measure(r, [&] {
      return cuda_error(kc::layernorm_backward(dinp.get(), dw.f32(), db.f32(), dout.get(),
                                               inp.get(), t, w.get(), t, mean.f32(), rstd.f32(), N,
                                               C, stream_));
    });
    // the residual connection: out = inp + dout (two reads, one write).
    r = row(m, "residual add", t, nc_shape(N, C));
    bytes(r, 3 * n * e);
    measure(r, [&] {
      return cuda_error(kc::add(out.get(), t, inp.get(), t, dout.get(), t, n, stream_));
    });
  }
  {
    const int64_t n = N * F;  // the MLP's hidden activation (N, F)
    DeviceBuffer inp(bytes_of(n, t)), out(bytes_of(n, t)), dout(bytes_of(n, t)),
        dinp(bytes_of(n, t));
    DeviceBuffer dbias(bytes_of(F, ElemType::kF32));  // (F)
    fill(inp.get(), t, n, 30, 3.f, stream_);
    fill(dout.get(), t, n, 31, 1.f, stream_);
    zero(dinp, stream_);
    zero(dbias, stream_);
    Row r = row(m, "gelu fwd", t, nc_shape(N, F));
    bytes(r, 2 * n * e);
    measure(r, [&] { return cuda_error(kc::gelu_forward(out.get(), inp.get(), t, n, stream_)); });
    r = row(m, "gelu bwd", t, nc_shape(N, F));  // inp, dout read; dinp written
    bytes(r, 3 * n * e);
    measure(r, [&] {
      return cuda_error(kc::gelu_backward(dinp.get(), inp.get(), dout.get(), t, n, stream_));
    });
    // dbias (F) += Σ_n dout: the backend's fallback when the bias-gradient epilogue is missing.
    r = row(m, "bias grad (fc)", t, nc_shape(N, F));
    bytes(r, n * e + 2 * F * f4);
    measure(r,
            [&] { return cuda_error(kc::bias_grad(dbias.f32(), dout.get(), t, N, F, stream_)); });
  }
  {
    const int64_t n = N * C;
    DeviceBuffer tokens(size_t(N) * sizeof(int32_t));                // (B, S)
    DeviceBuffer wte(bytes_of(int64_t{m.Vp} * C, t));                // (Vp, C)
    DeviceBuffer wpe(bytes_of(int64_t{m.S} * C, t));                 // (S, C)
    DeviceBuffer out(bytes_of(n, t));                                // (B, S, C)
    DeviceBuffer dwte(bytes_of(int64_t{m.Vp} * C, ElemType::kF32));  // (Vp, C)
    DeviceBuffer dwpe(bytes_of(int64_t{m.S} * C, ElemType::kF32));   // (S, C)
    const int64_t distinct = fill_tokens(tokens, N, m.V, 40, stream_);
    fill(wte.get(), t, int64_t{m.Vp} * C, 41, 0.02f, stream_);
    fill(wpe.get(), t, int64_t{m.S} * C, 42, 0.02f, stream_);
    fill(out.get(), t, n, 43, 1.f, stream_);  // used as dout below
    zero(dwte, stream_);
    zero(dwpe, stream_);
    const std::string shape = nc_shape(N, C) + " V" + std::to_string(m.Vp);
    const std::string note = std::to_string(distinct) + " distinct tokens";
    // tokens read, one wte row per distinct token and all of wpe read, out written.
    Row r = row(m, "embedding fwd", t, shape);
    bytes(r, N * f4 + double(distinct) * C * e + double(m.S) * C * e + n * e);
    r.note = note;
    measure(r, [&] {
      return cuda_error(kc::embedding_forward(out.get(), t, tokens.i32(), wte.get(), wpe.get(), t,
                                              m.B, m.S, C, 0, m.Vp, stream_));
    });
    // dout, tokens read; one dwte row per distinct token and all of dwpe read+written (f32).
    r = row(m, "embedding bwd", t, shape);
    bytes(r, n * e + N * f4 + 2 * double(distinct) * C * f4 + 2 * double(m.S) * C * f4);
    r.note = note;
    measure(r, [&] {
      return cuda_error(kc::embedding_backward(dwte.f32(), dwpe.f32(), out.get(), t, tokens.i32(),
                                               m.B, m.S, C, 0, m.Vp, stream_));
    });
  }
}

// The vocab-parallel cross-entropy on the whole vocabulary (one rank): logits (N, Vp) of which
// the first V columns are real.
void Bench::cross_entropy(const Model& m, ElemType t) {
  const int64_t N = m.N();
  const int V = m.V, ld = m.Vp;
  const double e = double(kc::elem_size(t)), f4 = 4.0;
  DeviceBuffer logits(bytes_of(N * ld, t)), dlogits(bytes_of(N * ld, t));  // (N, Vp)
  DeviceBuffer targets(size_t(N) * sizeof(int32_t));                       // (N)
  DeviceBuffer row_max(bytes_of(N, ElemType::kF32)), row_sumexp(bytes_of(N, ElemType::kF32)),
      target_logit(bytes_of(N, ElemType::kF32)), losses(bytes_of(N, ElemType::kF32));  // (N)
  fill(logits.get(), t, N * ld, 50, 4.f, stream_);
  fill_tokens(targets, N, V, 51, stream_);
  const std::string shape =
      "N" + std::to_string(N) + " V" + std::to_string(V) + " ld" + std::to_string(ld);
  const double logit_bytes = double(N) * V * e;  // the real columns, read once
  // The row max and Σexp in one online pass.
  Row r = row(m, "ce row stats (max, sumexp)", t, shape);
  bytes(r, logit_bytes + 2 * N * f4);
  measure(r, [&] {
    return cuda_error(
        kc::ce_row_stats(row_max.f32(), row_sumexp.f32(), logits.get(), t, N, ld, V, stream_));
  });
  // One logit per row plus the row statistics: far too little to fill the GPU, shown for scale.
  r = row(m, "ce target logit + losses", t, shape);
  bytes(r, N * (f4 + e + f4) + 4 * N * f4, "latency");
  measure(r, [&] {
    std::string err = cuda_error(kc::ce_target_logit(target_logit.f32(), logits.get(), t,
                                                     targets.i32(), N, ld, 0, V, stream_));
    if (!err.empty()) return err;
    return cuda_error(kc::ce_losses(losses.f32(), row_max.f32(), row_sumexp.f32(),
                                    target_logit.f32(), nullptr, N, stream_));
  });
  // real logits read, every dlogits column written (padding zeroed), stats and targets read.
  r = row(m, "ce bwd (softmax - onehot)", t, shape);
  bytes(r, logit_bytes + double(N) * ld * e + 3 * N * f4);
  measure(r, [&] {
    return cuda_error(kc::ce_backward(dlogits.get(), t, logits.get(), t, row_max.f32(),
                                      row_sumexp.f32(), targets.i32(), nullptr, 1.f / float(N), N,
                                      ld, 0, V, stream_));
  });
}

// The per-step work on every parameter: the bf16 copy of the master weights, the gradient's sum
// of squares (for clipping) and AdamW, the last two multi-tensor over the model's tensors.
void Bench::optimizer(const Model& m) {
  const std::vector<ParamTensor> tensors = param_tensors(m);
  int64_t n = 0;
  for (const ParamTensor& p : tensors) n += p.n;
  DeviceBuffer param(bytes_of(n, ElemType::kF32)), grad(bytes_of(n, ElemType::kF32)),
      mom(bytes_of(n, ElemType::kF32)), var(bytes_of(n, ElemType::kF32));  // (n) each
  DeviceBuffer param_lp(bytes_of(n, ElemType::kBF16));                     // (n)
  DeviceBuffer sum(sizeof(double));
  fill(param.get(), ElemType::kF32, n, 60, 0.02f, stream_);
  fill(grad.get(), ElemType::kF32, n, 61, 1e-3f, stream_);
  zero(mom, stream_);
  zero(var, stream_);
  zero(sum, stream_);
  std::vector<kc::AdamWSegment> adam;
  std::vector<kc::SumSquaresSegment> sumsq;
  int64_t off = 0;
  for (const ParamTensor& p : tensors) {
    kc::AdamWSegment s;
    s.param = param.f32() + off, s.grad = grad.f32() + off;
    s.m = mom.f32() + off, s.v = var.f32() + off;
    s.n = p.n, s.decay = p.decay;
    adam.push_back(s);
    sumsq.push_back({grad.f32() + off, ElemType::kF32, p.n});
    off += p.n;
  }
  const double f4 = 4.0;
  const std::string shape =
      "n" + std::to_string(n) + " in " + std::to_string(tensors.size()) + " tensors";
  Row r = row(m, "cast params f32->bf16", ElemType::kF32, "n" + std::to_string(n));
  bytes(r, n * (f4 + 2.0), "optimizer");
  measure(r, [&] {
    return cuda_error(
        kc::cast(param_lp.get(), ElemType::kBF16, param.get(), ElemType::kF32, n, stream_));
  });
  r = row(m, "grad-norm sumsq (multi-tensor)", ElemType::kF32, shape);
  bytes(r, n * f4, "optimizer");
  measure(r, [&] {
    return cuda_error(kc::sum_squares_multi_tensor(static_cast<double*>(sum.get()), sumsq.data(),
                                                   static_cast<int>(sumsq.size()), stream_));
  });
  kc::AdamWHyper h;
  h.lr = 3e-4f, h.beta1 = 0.9f, h.beta2 = 0.95f, h.eps = 1e-8f, h.weight_decay = 0.1f;
  h.step = 10;
  // param, m, v read and written, grad read.
  r = row(m, "adamw (multi-tensor)", ElemType::kF32, shape);
  bytes(r, 7 * n * f4, "optimizer");
  measure(r, [&] {
    return cuda_error(
        kc::adamw_multi_tensor(adam.data(), static_cast<int>(adam.size()), h, stream_));
  });
}

// ---- summary and JSON ----------------------------------------------------------------------

// Per model and precision: "summary 124m bf16: gemm 41-72%, attention fwd 38% bwd 25% (cudnn
// fwd 45% bwd 30%), memory-bound 40-85% of HBM" (GEMMs and attention of their precision's
// peak; the cuDNN part only where cuDNN ran); per model: "summary 124m optimizer: ..." with
// each optimizer row's % of HBM. Rows a library refuses (unsupported) are left out.
void print_summary(const std::vector<Row>& rows, const std::vector<Model>& models,
                   const std::vector<ElemType>& types) {
  for (const Model& m : models) {
    for (ElemType t : types) {
      double gmin = 1e9, gmax = -1, mmin = 1e9, mmax = -1, afwd = -1, abwd = -1;
      double cfwd = -1, cbwd = -1;  // cuDNN's attention
      int failed = 0;
      for (const Row& r : rows) {
        if (r.model != m.name || r.type != kc::to_string(t) || r.group == "optimizer") continue;
        if (!r.unsupported.empty()) continue;
        if (!r.time.error.empty()) {
          ++failed;
          continue;
        }
        const double p = r.percent();
        if (r.group == "gemm") {
          gmin = std::min(gmin, p), gmax = std::max(gmax, p);
        } else if (r.group == "attention" && r.op.find("cudnn") != std::string::npos) {
          (r.op.find("fwd") != std::string::npos ? cfwd : cbwd) = p;
        } else if (r.group == "attention") {
          (r.op.find("fwd") != std::string::npos ? afwd : abwd) = p;
        } else if (r.group == "memory") {
          mmin = std::min(mmin, p), mmax = std::max(mmax, p);
        }
      }
      std::string line = "summary " + m.name + " " + kc::to_string(t) + ":";
      char buf[96];
      if (gmax >= 0) {
        std::snprintf(buf, sizeof buf, " gemm %.0f-%.0f%%,", gmin, gmax);
        line += buf;
      }
      if (afwd >= 0 || abwd >= 0) {
        std::snprintf(buf, sizeof buf, " attention fwd %.0f%% bwd %.0f%%", afwd, abwd);
        line += buf;
        if (cfwd >= 0 || cbwd >= 0) {
          std::snprintf(buf, sizeof buf, " (cudnn fwd %.0f%% bwd %.0f%%)", cfwd, cbwd);
          line += buf;
        }
        line += ",";
      }
      if (mmax >= 0) {
        std::snprintf(buf, sizeof buf, " memory-bound %.0f-%.0f%% of HBM,", mmin, mmax);
        line += buf;
      }
      if (failed) line += " " + std::to_string(failed) + " FAILED,";
      line.pop_back();  // the last comma, or the colon of an empty line
      std::printf("%s\n", line.c_str());
    }
    std::string line = "summary " + m.name + " optimizer (% of HBM):";
    for (const Row& r : rows) {
      if (r.model != m.name || r.group != "optimizer") continue;
      char buf[96];
      if (r.time.error.empty())
        std::snprintf(buf, sizeof buf, " %s %.0f%%,", r.op.substr(0, r.op.find(' ')).c_str(),
                      r.percent());
      else
        std::snprintf(buf, sizeof buf, " %s FAILED,", r.op.substr(0, r.op.find(' ')).c_str());
      line += buf;
    }
    line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

void write_json(const std::string& path, const nlohmann::ordered_json& head,
                const std::vector<Row>& rows) {
  nlohmann::ordered_json j = head;
  j["rows"] = nlohmann::ordered_json::array();
  for (const Row& r : rows) {
    nlohmann::ordered_json o;
    o["model"] = r.model;
    o["op"] = r.op;
    o["type"] = r.type;
    o["shape"] = r.shape;
    o["unit"] = r.unit == Unit::kFlops ? "TFLOP/s" : "GB/s";
    o["work"] = r.work;  // FLOPs or bytes per call
    if (!r.unsupported.empty()) {
      o["unsupported"] = r.unsupported;
    } else if (r.time.error.empty()) {
      o["ms"] = r.time.ms;
      o["rate"] = r.rate() / (r.unit == Unit::kFlops ? 1e12 : 1e9);
      o["percent_of_peak"] = r.percent();
    } else {
      o["error"] = r.time.error;
    }
    o["peak"] = r.peak_name;
    if (!r.note.empty()) o["note"] = r.note;
    j["rows"].push_back(o);
  }
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  if (!f) die("cannot write " + path);
}

// ---- command line --------------------------------------------------------------------------

struct Options {
  std::vector<std::string> models = {"124m", "1.3b", "llama3-8b"};
  std::vector<std::string> types = {"bf16", "f32"};
  int reps = 20;
  std::string json;
  double peak_bf16 = 989, peak_fp32 = 67, hbm_gbps = 0;  // hbm 0: by device name
  std::vector<int> context_seqs;                         // ring attention's sequence lengths
};

// Prints the usage line after `error` (to stderr, exit 2), or alone (to stdout, exit 0).
[[noreturn]] void usage(const std::string& error) {
  FILE* to = error.empty() ? stdout : stderr;
  if (!error.empty()) std::fprintf(to, "bench_cuda_kernels: %s\n", error.c_str());
  std::fprintf(to,
               "usage: bench_cuda_kernels [--models 124m,1.3b] [--types bf16,f32] [--reps N] "
               "[--json FILE]\n"
               "                          [--peak-bf16 TFLOPS] [--peak-fp32 TFLOPS] "
               "[--hbm-gbps GBPS]\n"
               "                          [--context-seqs S,...]\n"
               "per-kernel GPU throughput against the roofline; see the top of "
               "bench/bench_cuda_kernels.cc\n");
  std::exit(error.empty() ? 0 : 2);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double positive(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x > 0))
    usage(flag + " wants a positive number, got '" + v + "'");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (a == "-h" || a == "--help") {
      usage("");
    } else if (i + 1 < argc) {
      v = argv[++i];
    } else {
      usage("missing value after " + a);
    }
    if (a == "--models") {
      o.models = split(v);
      for (const std::string& m : o.models)
        if (m != "124m" && m != "1.3b" && m != "llama3-8b")
          usage("unknown model '" + m + "' (124m, 1.3b, llama3-8b)");
    } else if (a == "--types") {
      o.types = split(v);
      for (const std::string& t : o.types)
        if (t != "bf16" && t != "f32") usage("unknown type '" + t + "' (bf16, f32)");
    } else if (a == "--reps") {
      o.reps = static_cast<int>(positive(a, v));
    } else if (a == "--json") {
      o.json = v;
    } else if (a == "--peak-bf16") {
      o.peak_bf16 = positive(a, v);
    } else if (a == "--peak-fp32") {
      o.peak_fp32 = positive(a, v);
    } else if (a == "--hbm-gbps") {
      o.hbm_gbps = positive(a, v);
    } else if (a == "--context-seqs") {
      for (const std::string& x : split(v)) {
        const double S = positive(a, x);
        if (S != static_cast<int>(S) || static_cast<int>(S) % 512 != 0)
          usage("--context-seqs wants multiples of 512, got '" + x + "'");
        o.context_seqs.push_back(static_cast<int>(S));
      }
    } else {
      usage("unknown argument " + a);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);

  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("bench_cuda_kernels: no CUDA device (%s)\n",
                e != cudaSuccess ? cuda_error(e).c_str() : "device count 0");
    return 0;
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const std::string name = prop.name;
  const bool h200 = name.find("H200") != std::string::npos;
  const Roofline roof{opt.peak_bf16, opt.peak_fp32,
                      opt.hbm_gbps > 0 ? opt.hbm_gbps : (h200 ? 4800.0 : 3350.0)};
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf(
      "bench_cuda_kernels: device %d %s (sm_%d%d, %d SMs, %s), CUDA runtime %d, driver %d\n",
      device, name.c_str(), prop.major, prop.minor, prop.multiProcessorCount,
      gib(double(prop.totalGlobalMem)).c_str(), runtime, driver);
  print_header(roof, opt.reps);

  std::vector<Model> models;
  for (const Model& m : kModels)
    if (std::find(opt.models.begin(), opt.models.end(), m.name) != opt.models.end())
      models.push_back(m);
  std::vector<ElemType> types;
  for (const std::string& t : opt.types)
    types.push_back(t == "bf16" ? ElemType::kBF16 : ElemType::kF32);

  Bench bench(roof, opt.reps);
  bench.memcpy_reference();
  for (const Model& m : models) {
    for (ElemType t : types) {
      if (m.llama) {
        bench.attention(m, t);
        bench.llama_rowwise(m, t);
        continue;
      }
      bench.linears(m, t);
      bench.attention(m, t);
      bench.rowwise(m, t);
      bench.cross_entropy(m, t);
    }
    if (!m.llama) bench.optimizer(m);
  }
  for (const int S : opt.context_seqs)
    for (const int c : {2, 4})
      for (ElemType t : types)
        if (t == ElemType::kBF16) bench.ring_attention(S, c, t);
  print_summary(bench.rows(), models, types);

  if (!opt.json.empty()) {
    nlohmann::ordered_json head;
    head["bench"] = "bench_cuda_kernels";
    head["device"] = {
        {"name", name},
        {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
        {"sm_count", prop.multiProcessorCount},
        {"memory_bytes", prop.totalGlobalMem},
        {"cuda_runtime", runtime},
        {"cuda_driver", driver}};
    head["roofline"] = {{"bf16_tflops", roof.bf16_tflops},
                        {"fp32_tflops", roof.fp32_tflops},
                        {"hbm_gbps", roof.hbm_gbps}};
    head["timing"] = {{"reps", opt.reps}, {"warmup", kWarmup}, {"statistic", "median"}};
    head["attention_flops"] =
        "causal: 4*B*NH*HS*S*(S+1)/2 forward, twice that backward (recompute not counted)";
    head["memory_bytes"] = "minimum: each array once, += outputs read and written";
    write_json(opt.json, head, bench.rows());
    std::printf("wrote %s\n", opt.json.c_str());
  }
  return 0;
}
