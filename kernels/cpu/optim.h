// optim.h — the CPU optimizer step: AdamW on raw f32 buffers, the reference of the multi-tensor
// kernels of kernels/cuda/optim.h. Loops use OpenMP.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

#include <cstddef>

namespace strata::kernels::cpu {

// One AdamW step on n parameters (decoupled weight decay, bias-corrected moments).
// step is 1-based; weight_decay is applied as param -= lr * wd * param. Each gradient is
// multiplied by grad_scale as it is read (the clipping coefficient; the gradients stay as they
// are).
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale);

}  // namespace strata::kernels::cpu
