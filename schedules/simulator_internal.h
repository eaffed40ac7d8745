// simulator_internal.h — what the simulator's files share (schedules/ only): the kinds of
// instruction, the names problems use for an instruction and a (micro-batch, chunk) pair, and the
// per-stage checks (stage_checker.cc) that simulate() runs before the lists (simulator.cc).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "schedules/schedule.h"

namespace strata::sim_internal {

inline bool is_comm(Op op) {
  return op == Op::kRecvActivation || op == Op::kSendActivation || op == Op::kRecvGrad ||
         op == Op::kSendGrad;
}
inline bool is_recv(Op op) {
  return op == Op::kRecvActivation || op == Op::kRecvGrad;
}
inline bool is_send(Op op) {
  return op == Op::kSendActivation || op == Op::kSendGrad;
}

// "stage s instruction i (F3.1)", as problems name an instruction.
inline std::string at(int stage, size_t index, const Instr& i) {
  return "stage " + std::to_string(stage) + " instruction " + std::to_string(index) + " (" +
         instr_string(i) + ")";
}

inline std::string pair_name(int mb, int chunk) {
  return "micro-batch " + std::to_string(mb) + " chunk " + std::to_string(chunk);
}

// What the per-stage checks find besides problems.
struct StageFacts {
  int peak_inflight = 0;  // (mb, chunk) pairs held at once (simulator.h's peak_inflight)
  int peak_versions = 0;  // weight versions needed at once (peak_weight_versions)
};

// The per-stage checks of simulator.h on stage `stage`'s list: each problem appended to
// `problems`, in the order of the list and of the checks.
StageFacts check_stage(const ScheduleSpec& spec, int stage, const std::vector<Instr>& list,
                       std::vector<std::string>* problems);

}  // namespace strata::sim_internal
