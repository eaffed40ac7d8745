// commands/profile_device.h — `strata profile --cluster-out`: the local device's efficiency
// curves (partitioner/efficiency.h), measured with the kernels the runtime itself runs, written
// into a cluster description the planner reads (`strata plan --cluster FILE`).
//
// What is measured, on the config's device (backend) and precision:
//   GEMMs      matmul_forward at a grid of (M, N, K) (powers of 4 from 128 to 2048 on the CPU,
//              from 256 to 16384 on a GPU, each GEMM at most 2^30 FLOPs on the CPU and 2^41 on
//              a GPU) and at
//              the config model's own layer and head GEMMs (forward and both gradients' shapes)
//              on tensor ranks of 1, 2, 4 and the config's parallel.tensor;
//              the curve is fitted to them (fit_gemm_curve) and they stay as its points;
//   attention  attention_forward / backward at the config's micro-batch, sequences S/4, S/2 and
//              S and head sizes 64, 128 and the model's, with C / head size heads;
//   memory     the model layer's elementwise kernels (norms, activation, residual adds, forward
//              and backward) at the config's micro-batch and sequence: the bytes the model's
//              description counts for them (ModelDescription::layer_work) over their time;
//   optimizer  the step's per-parameter work (zero, norm, AdamW, bf16 copy) over a 16M-element
//              buffer: the runtime's bytes per parameter (runtime/base/behaviour.h) over its time;
//   kernel gap the time of an add on one element (a launch on a GPU);
//   links      with two or more ranks (mpirun), all-reduces over the world of 64 KiB to 16 MiB
//              fitted to the ring formula the planner uses: the "intra_node" bandwidth and
//              latency (efficiency 1: the bandwidth is the one reached), and the cluster is then
//              one node of that many ranks.
// Every rank runs the compute measurements at the same time, started together per kind of
// figure (ranks sharing a machine contend as in training); rank 0 writes the file. Each figure is
// the median of `repeat` rounds of as many calls as fill a round (20 ms on the CPU, 5 ms on a GPU),
// after one warm-up call.
//
// The cluster written is `base` (its name, nodes, links, memory, device) with "efficiency"
// measured here; its "sustained" share is kept from `base` when base's was measured, else 1
// (the curves are then taken to be what training keeps).
//
// Thread-safety: one call at a time (it uses the whole machine for its timings).
#pragma once

#include <nlohmann/json.hpp>

#include "partitioner/cluster.h"
#include "runtime/backend/backend.h"
#include "runtime/base/config.h"
#include "runtime/comm/comm.h"

namespace strata {

// The cluster JSON described above. world: the job's communicator (nullptr or size 1: no link
// measurement). Collective over world.
nlohmann::json measure_device_cluster(const Config& cfg, Backend& be, Communicator* world,
                                      const Cluster& base, int repeat);

}  // namespace strata
