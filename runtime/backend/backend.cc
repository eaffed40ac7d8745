// The one backend factory: the only place that decides between CPU and CUDA.
#include "runtime/backend/backend.h"

#include <stdexcept>

#include "kernels/cpu/blas.h"
#include "runtime/backend/backend_checks.h"
#include "runtime/base/error.h"
#include "runtime/comm/comm.h"

namespace strata {

std::unique_ptr<Backend> make_cpu_backend(int threads);  // backend_cpu.cc
#ifdef STRATA_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device, CudnnAttentionUse cudnn);  // backend_cuda.cu
#endif

std::string compiled_backends() {
#ifdef STRATA_HAVE_CUDA
  return "cpu, cuda, mpi, nccl";
#else
  return "cpu, mpi";
#endif
}

std::string cpu_kernels() {
  try {
    const kernels::cpu::BlasInfo& blas = kernels::cpu::blas_info();
    return kernels::cpu::blas_summary() + " kernels (chosen by " + blas.chosen_by +
           (blas.chosen_by == "OPENBLAS_CORETYPE" ? "" : "; OPENBLAS_CORETYPE overrides") + "), " +
           blas.parallel + " threads, " + blas.library;
  } catch (const std::exception& e) {
    return e.what();
  }
}

// "auto" is the GPU where one is visible (verified on an H100, issue 7), else the CPU. The CUDA
// emulation build keeps "auto" on the CPU: its GPU runs kernels on the CPU, for tests only.
Device backend_device(const std::string& device) {
  if (device == "cpu") return Device::kCPU;
  if (device == "cuda") return Device::kCUDA;
#if defined(STRATA_HAVE_CUDA) && !defined(STRATA_CUDA_EMULATION)
  return cuda_device_count() > 0 ? Device::kCUDA : Device::kCPU;
#else
  return Device::kCPU;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device, int threads,
                                      const std::string& attention_backend) {
  if (backend_device(device) == Device::kCPU) {
    if (attention_backend == "cudnn") {
      throw InputError("<config>", "train.attention_backend",
                       "\"auto\" or \"strata\" on the CPU: \"cudnn\" needs device \"cuda\"");
    }
    return make_cpu_backend(threads);
  }
#ifdef STRATA_HAVE_CUDA
  const CudnnAttentionUse cudnn = attention_backend == "cudnn"  ? CudnnAttentionUse::kAlways
                                  : attention_backend == "auto" ? CudnnAttentionUse::kWhereItRuns
                                                                : CudnnAttentionUse::kNever;
  if (cuda_device_count() > 0) return make_cuda_backend(local_device_index(), cudnn);
  throw InputError("<config>", "device", "\"cpu\" or \"auto\": no CUDA device is visible");
#else
  throw InputError("<config>", "device",
                   "\"cpu\" or \"auto\": this build has no CUDA backend (got \"" + device + "\")");
#endif
}

void Backend::matmul_residual_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                                      const Tensor* bias, const Tensor& residual) {
  matmul_forward(out, inp, w, bias);
  add_inplace(out, residual);
}

void Backend::matmul_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                                  const Tensor& bias, GeluKind kind) {
  matmul_forward(pre, inp, w, &bias);
  gelu_forward(out, pre, kind);
}

void Backend::matmul_backward_input_gelu(Tensor& dpre, const Tensor& dout, const Tensor& w,
                                         const Tensor& pre, GeluKind kind) {
  // d(gelu(pre)) is an activation-sized temporary, counted as the model's d(gelu) always was.
  Tensor dact = empty(pre.shape(), MemCategory::kActivations, dpre.dtype());
  matmul_backward_input(dact, dout, w);
  gelu_backward(dpre, pre, dact, kind);
}

namespace {

// Calls f(g, first row, rows) for every group with rows, in order.
template <class F>
void for_each_group(const std::vector<int64_t>& rows, F f) {
  int64_t r0 = 0;
  for (size_t g = 0; g < rows.size(); r0 += rows[g], ++g)
    if (rows[g] > 0) f(static_cast<int64_t>(g), r0, rows[g]);
}

}  // namespace

// The grouped GEMMs as one matmul per group on views of the group's rows and its weight.
void Backend::grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w,
                                     const std::vector<int64_t>& rows) {
  const auto d = backend_checks::grouped_matmul_dims(w, rows, inp, out, "grouped matmul weight",
                                                     "grouped matmul inp", "grouped matmul out");
  for_each_group(rows, [&](int64_t g, int64_t r0, int64_t n) {
    Tensor o = out.view(r0 * d.O, {n, d.O});
    matmul_forward(o, inp.view(r0 * d.I, {n, d.I}), w.view(g * d.O * d.I, {d.O, d.I}), nullptr);
  });
}

void Backend::grouped_matmul_backward_input(Tensor& dinp, const Tensor& dout, const Tensor& w,
                                            const std::vector<int64_t>& rows) {
  const auto d = backend_checks::grouped_matmul_dims(w, rows, dinp, dout, "grouped matmul weight",
                                                     "grouped matmul dinp", "grouped matmul dout");
  for_each_group(rows, [&](int64_t g, int64_t r0, int64_t n) {
    Tensor di = dinp.view(r0 * d.I, {n, d.I});
    matmul_backward_input(di, dout.view(r0 * d.O, {n, d.O}), w.view(g * d.O * d.I, {d.O, d.I}));
  });
}

void Backend::grouped_matmul_backward_weight(Tensor& dw, const Tensor& dout, const Tensor& inp,
                                             const std::vector<int64_t>& rows) {
  const auto d = backend_checks::grouped_matmul_dims(dw, rows, inp, dout, "grouped matmul dweight",
                                                     "grouped matmul inp", "grouped matmul dout");
  for_each_group(rows, [&](int64_t g, int64_t r0, int64_t n) {
    Tensor dwg = dw.view(g * d.O * d.I, {d.O, d.I});
    matmul_backward_weight(dwg, nullptr, dout.view(r0 * d.O, {n, d.O}),
                           inp.view(r0 * d.I, {n, d.I}));
  });
}

namespace {
[[noreturn]] void no_ring_attention(const Backend& be) {
  throw std::runtime_error(
      "backend " + be.name() +
      " has no ring attention blocks (context parallelism runs on the CPU backend)");
}
}  // namespace

void Backend::attention_block_forward(Tensor&, Tensor&, const Tensor&, const Tensor&,
                                      const AttentionBlock&) {
  no_ring_attention(*this);
}
void Backend::attention_block_merge(Tensor&, Tensor&, const Tensor&, const Tensor&,
                                    const AttentionBlock&) {
  no_ring_attention(*this);
}
void Backend::attention_block_delta(Tensor&, const Tensor&, const Tensor&, int) {
  no_ring_attention(*this);
}
void Backend::attention_block_backward(Tensor&, Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, const Tensor&,
                                       const AttentionBlock&) {
  no_ring_attention(*this);
}
void Backend::attention_kv_extract(Tensor&, const Tensor&, int, int) {
  no_ring_attention(*this);
}
void Backend::attention_qkv_assemble(Tensor&, const Tensor&, const Tensor&, int, int) {
  no_ring_attention(*this);
}

const Tensor& MixedPrecisionScope::in(const Tensor& t) {
  if (t.dtype() != DType::kBF16) return t;
  temps_.push_back(std::make_unique<Tensor>(be_.empty(t.shape(), MemCategory::kBuffers)));
  be_.cast(*temps_.back(), t);
  return *temps_.back();
}

Tensor& MixedPrecisionScope::out(Tensor& t) {
  if (t.dtype() != DType::kBF16) return t;
  temps_.push_back(std::make_unique<Tensor>(be_.empty(t.shape(), MemCategory::kBuffers)));
  be_.cast(*temps_.back(), t);
  write_back_.emplace_back(&t, temps_.back().get());
  return *temps_.back();
}

MixedPrecisionScope::~MixedPrecisionScope() {
  for (auto& [dst, tmp] : write_back_) be_.cast(*dst, *tmp);
}

}  // namespace strata
