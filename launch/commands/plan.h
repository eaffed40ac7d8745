// commands/plan.h — `strata plan`: search the parallel layouts of a model on a cluster and print
// the best plans with their predicted time and memory (partitioner/planner.h).
//
//   strata plan --model FILE|PRESET --cluster FILE|PRESET --global-batch-size B [--nodes N]
//               [--fix k=v,...] [--top K] [--json OUT] [--trace OUT] [--seq-len S]
//               [--precision bf16|fp32] [--profile PROFILE.json] [--help]
//
// The config-to-plan code `strata train` shares with it lives in launch/plan/.
//
// Thread-safety: one call at a time (writes stdout and files).
#pragma once

#include <string>
#include <vector>

namespace strata {

// Runs the command on its arguments (those after "plan"); returns the exit status. Throws
// InputError for bad arguments or files.
int cmd_plan(const std::vector<std::string>& args);

}  // namespace strata
