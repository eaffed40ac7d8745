// optim.cc — CPU implementation of kernels/cpu/optim.h.
#include "kernels/cpu/optim.h"

#include <omp.h>

#include <cmath>

#include "kernels/cpu/util.h"

namespace strata::kernels::cpu {

namespace {

// Elements [i0, i1) of the update, once per vector width (each element's operations are the same
// in every clone).
STRATA_CPU_CLONES void adamw_range(float* param, const float* grad, float* m, float* v, size_t i0,
                                   size_t i1, float lr, float beta1, float beta2, float eps,
                                   float weight_decay, float grad_scale, float bc1, float bc2) {
#pragma omp simd
  for (size_t i = i0; i < i1; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale) {
  // Bias corrections in double: 1 - β2^step is ~1e-3 at step 1 and float's pow would cost digits.
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
#pragma omp parallel
  {
    size_t i0, i1;
    thread_share(n, omp_get_thread_num(), omp_get_num_threads(), i0, i1);
    adamw_range(param, grad, m, v, i0, i1, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1,
                bc2);
  }
}

}  // namespace strata::kernels::cpu
