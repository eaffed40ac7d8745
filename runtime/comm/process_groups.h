// process_groups.h — the process layout of PTD-P: which ranks form each tensor-, data- and
// pipeline-parallel group, built in one place.
//
// Rank order is Megatron-LM's: tensor-parallel ranks are consecutive (so a tensor-parallel group
// sits on one node, on its fast links), then context, then data-parallel, then pipeline:
//     world_rank = tp + t · (cp + c · (dp + d · pp))
// For t = 2, p = 2, d = 2 (c = 1): tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3}
// {4,6} {5,7}; pp groups {0,4} {1,5} {2,6} {3,7}. Inside every group, group rank = the rank's
// coordinate of that kind (the tp group rank is tp, the pp group rank is pp, ...).
//
// Context parallelism (parallel.context = c): every sequence is split over the c ranks of a
// context group, which hold the same weights and the same sequences.
//   cp   (context)   c members: the same (tp, dp, pp); group rank = cp. Ring attention's keys and
//                    values travel around it.
//   dp   becomes data × context (Megatron-Core's data-parallel group with context): d·c members,
//        group rank cp + c·dp (the "replica" coordinate), since every context rank holds a part of
//        the weights' gradients; dp_rank stays the data coordinate (which sequences a rank reads).
//
// Expert parallelism (a mixture of experts, parallel.expert = e dividing d): the data ranks are
// cut into runs of e consecutive ones (docs/contracts.md's rank order).
//   ep   (expert)       e members: data ranks [b·e, (b+1)·e) of the same (tp, cp, pp); group rank
//                       = dp % e. A MoE layer's experts are spread over it; its tokens travel by
//                       all-to-all.
//   edp  (expert-data)  c·d/e members: the ranks of the same (tp, pp) holding the same experts,
//                       data ranks {j, j+e, j+2e, …} at every context rank; group rank
//                       cp + c·(dp / e). The expert weights' gradients are summed over it (each
//                       rank of an ep group holds other experts), as the dense weights' are over
//                       dp (data × context).
// With context, an expert group is cut from the data ranks of one context rank (the chunks a
// rank holds travel to the experts of ranks holding the same chunks of other sequences), as
// Megatron-Core cuts its expert groups from data × context with the context ranks outermost.
// With e = 1 there are no such groups (ep and edp are nullptr): the dense reduction covers all.
//
// Besides tp, dp and pp, two groups the training step needs:
//   mp        (model parallel) the t·p ranks holding one full model replica, same (dp, cp): the
//             gradient norm is summed over it; group rank = tp + t · pp.
//   embedding first and last pipeline stage of the same (tp, cp, dp): the tied input/output
//   embedding
//             gradients are summed over it. One member when p = 1; middle stages are in none.
//
// group_layout() is a pure function (no MPI): tests and the planner use it directly.
// make_process_groups() turns it into communicators; it is collective over the world.
//
// Thread-safety: GroupLayout is a value. ProcessGroups owns communicators (see comm.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"

namespace strata {

struct RankCoord {
  int tp = 0, dp = 0, pp = 0;
  int cp = 0;
  int replica = 0;  // cp + c·dp: the rank's place in the dp (data × context) group
};

struct GroupLayout {
  int tensor = 1, pipeline = 1, data = 1;
  int expert = 1;   // e, dividing data
  int context = 1;  // c

  int world_size() const { return tensor * context * pipeline * data; }
  int world_rank(int tp, int dp, int pp, int cp = 0) const {
    return tp + tensor * (cp + context * (dp + data * pp));
  }
  RankCoord coord(int world_rank) const;

  // Members of every group of each kind, as world ranks in group-rank order. The index of a
  // group is given beside it (r = cp + c·dp, the replica coordinate); *_group_of() returns it
  // for a world rank.
  std::vector<std::vector<int>> tp_groups;         // [cp + c·(dp + d·pp)]: t members, by tp
  std::vector<std::vector<int>> dp_groups;         // [tp + t·pp]: d·c members, by r
  std::vector<std::vector<int>> pp_groups;         // [tp + t·r]: p members, by pp
  std::vector<std::vector<int>> mp_groups;         // [r]: t·p members, by tp + t·pp
  std::vector<std::vector<int>> embedding_groups;  // [tp + t·r]: stages 0, p-1 (one if p = 1)
  // Empty when context = 1.
  std::vector<std::vector<int>> cp_groups;  // [tp + t·(dp + d·pp)]: c members, by cp
  // Empty when expert = 1.
  // [((tp + t·pp)·c + cp)·(d/e) + dp/e]: e members, by dp % e
  std::vector<std::vector<int>> ep_groups;
  // [(tp + t·pp)·e + dp%e]: c·d/e members, by cp + c·(dp / e)
  std::vector<std::vector<int>> edp_groups;

  int tp_group_of(int world_rank) const;
  int dp_group_of(int world_rank) const;
  int pp_group_of(int world_rank) const;
  int mp_group_of(int world_rank) const;
  int embedding_group_of(int world_rank) const;  // -1 on middle pipeline stages
  int cp_group_of(int world_rank) const;
  int ep_group_of(int world_rank) const;
  int edp_group_of(int world_rank) const;
};

// The layout of t·c·p·d ranks (each ≥ 1), with expert groups of e (dividing d) and context
// groups of c.
GroupLayout group_layout(int t, int p, int d, int e = 1, int c = 1);

struct ProcessGroups {
  int tensor = 1, pipeline = 1, data = 1, expert = 1, context = 1;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
  int cp_rank = 0;   // this rank's place in its context group: chunks cp and 2c−1−cp
  int ep_rank = 0;   // dp_rank % expert: which run of experts this rank holds
  int edp_rank = 0;  // cp + context·(dp / expert): its place in the edp group (0: the first
                     // replica of its experts); the dp group's rank when expert = 1
  int prev_stage_rank = -1, next_stage_rank = -1;  // world ranks; -1 at the pipeline's ends
  CommBackend backend = CommBackend::kLocal;
  bool staged = false;  // device tensors carried over `backend` through host copies
  GroupLayout layout;

  // Communicators on `backend` (device buffers for NCCL). In pp, the neighbours are group ranks
  // pp_rank - 1 and pp_rank + 1. embedding is nullptr on middle stages.
  std::unique_ptr<Communicator> world, tp, dp, pp, mp, embedding;
  // Expert parallelism (expert > 1 only; nullptr otherwise): the expert group and the
  // expert-data-parallel group.
  std::unique_ptr<Communicator> ep, edp;
  // Context parallelism (context > 1 only; nullptr otherwise): the context group.
  std::unique_ptr<Communicator> cp;
  // The group an expert weight's gradient is summed over: edp, or dp without expert parallelism.
  Communicator* expert_data() const { return edp ? edp.get() : dp.get(); }
  // The world on host buffers (MPI, or Local for one rank) for control messages: the rank table,
  // logging, agreeing on a decision. Same as `world` in kind when backend is not NCCL.
  std::unique_ptr<Communicator> host;

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pipeline - 1; }
  // Passes the compute stream to every device communicator (see Communicator::set_compute_stream).
  void set_compute_stream(void* stream);
};

// How a run's tensors travel between ranks: the one choice of transport.
struct Transport {
  CommBackend backend = CommBackend::kLocal;
  bool staged = false;              // device tensors over a host backend (make_staged_communicator)
  bool for_buffered_sends = false;  // staged although NCCL was there: the schedule needs MPI's
};
// Host tensors: MPI (Local for one rank). CUDA tensors: NCCL when it is built and every rank on a
// host has a GPU of its own (devices_per_host ≥ ranks_per_host); otherwise, when ranks share a
// GPU (NCCL refuses two ranks on one device) or NCCL is missing, MPI (Local for one rank) staged
// through host memory. needs_buffered_sends (a pipeline schedule that does not run on NCCL's
// rendezvous sends: runs_on_rendezvous_sends, simulator.h) also keeps CUDA tensors on
// staged MPI. A pure function: tests and the dry run call it directly.
Transport choose_transport(Device tensors, int world_size, int ranks_per_host, int devices_per_host,
                           bool nccl_built, bool needs_buffered_sends = false);
// "nccl", "mpi", "mpi, staged through host memory", ...
std::string to_string(const Transport& t);

// Builds every group for this rank. Collective over the world; needs init_world(). Throws
// InputError when t·c·p·d differs from the world size (naming both numbers) or e does not divide
// d.
// With `staging`, every group but `host` carries device tensors over `backend` (a host backend)
// through host copies.
ProcessGroups make_process_groups(int t, int p, int d, CommBackend backend, double timeout_s,
                                  std::shared_ptr<DeviceStaging> staging = nullptr, int e = 1,
                                  int c = 1);

// The dry-run table, one line per world rank: rank → (tp, dp, pp, and cp, ep where used), host,
// device. device_name is
// this rank's device ("cpu", "cuda:0"). Collective over g.host; the text on world rank 0, ""
// elsewhere.
std::string rank_table(const ProcessGroups& g, const std::string& device_name);

// This rank alone as a complete layout (t = p = d = 1) on Local communicators, whatever the
// world size: the single-process reference run inside a multi-rank test. Not collective.
// With `staging`, the groups take device tensors (see make_process_groups).
ProcessGroups make_single_process_groups(double timeout_s,
                                         std::shared_ptr<DeviceStaging> staging = nullptr);

}  // namespace strata
