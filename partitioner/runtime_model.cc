#include "partitioner/runtime_model.h"

#include "runtime/base/behaviour.h"

namespace strata {

RuntimeModel strata_runtime(bool cpu, const std::string& precision, double bucket_mb) {
  RuntimeModel r;
  r.name = cpu ? "strata (CPU, MPI)" : "strata (CUDA, NCCL)";
  // Strata's attention is one fused kernel per direction on a GPU (cuDNN's or its own flash
  // kernels); on the CPU one kernel over saved probabilities, timed whole by strata profile.
  r.fused_attention = true;
  r.tp_overlap = behaviour::kTensorParallelOverlap;
  r.dp_overlap = behaviour::kReduceBucketsDuringBackward;
  r.collectives_progress_alone =
      cpu ? behaviour::kHostCollectivesProgressAlone : behaviour::kDeviceCollectivesProgressAlone;
  r.bucket_bytes = bucket_mb * 1024 * 1024;  // GradReducer's buckets: bucket_mb MiB of f32
  r.grad_wire_bytes = behaviour::kGradientWireBytes;
  r.param_wire_bytes = behaviour::kParamGatherWireBytes;
  r.param_gather_overlap = behaviour::kGatherParamsDuringForward;
  r.p2p_both_ends = cpu ? behaviour::kHostSendsBlock : behaviour::kDeviceGroupsWaitForSends;
  // TransformerModel::boundary_shape: each rank sends what it holds (its sequence chunk with
  // sequence parallelism, else the whole activation).
  r.p2p_scatter_gather = false;
  // The ring's transfers hide behind the blocks only where the transport moves them alone.
  r.ring_overlap = behaviour::kRingOverlapsAttention && r.collectives_progress_alone;
  r.ring_grad_wire_bytes = behaviour::kRingGradWireBytes;
  r.step_bytes_per_param =
      precision == "fp32" ? behaviour::kStepBytesPerParamF32 : behaviour::kStepBytesPerParamBf16;
  // The kernels models/layers/block.cc issues per GPT layer on the CUDA backend: forward two
  // LayerNorms, four GEMMs (bias, GELU and residual in their epilogues) and the attention;
  // backward the GEMMs' input and weight gradients, the bias and LayerNorm column sums, two
  // LayerNorm backwards, the attention backward and the residual adds.
  r.kernels_per_layer_fwd = 8;
  r.kernels_per_layer_bwd = 18;
  return r;
}

}  // namespace strata
