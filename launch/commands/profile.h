// commands/profile.h — `strata profile`: time each piece of the config's model on this machine and
// backend, and write the measured profile the planner reads (`strata plan --profile`).
//
//   strata profile --config FILE [--set k=v ...] [--out PROFILE.json] [--repeat N]
//                  [--micro-batch-sizes b1,b2,...] [--help]
//
// What is timed, per micro-batch size (default: the config's train.micro_batch_size), at the
// config's sequence length, precision, device and train.threads, on the config's model (built
// through models/registry.h, recompute none) holding three pieces: the embedding alone, one
// transformer layer, the head (final norm, logits, loss); the forward and backward of each,
// what selective recompute repeats (Model::rerun_selective_recompute: the attention core's
// forward) alone, and the per-step work that scales with the
// parameters (zeroing the gradients, the gradient norm, clipping, the AdamW update over the
// parameters' segments) divided by the parameter count. After two warm-up passes, each figure
// is the median over N rounds of the mean of as many passes as fill 50 ms: a round averages
// the machine's scheduling noise the way a training step does. The JSON is
// partitioner/cost_model.h's profile format (profile_from_json); full recompute adds the
// forward to the backward there, selective the attention core's forward.
// docs/planner.md: the format and the CPU time test.
//
// Thread-safety: one call at a time (uses the whole machine for its timings).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "partitioner/cluster.h"
#include "partitioner/cost_model.h"
#include "runtime/base/config.h"

namespace strata {

// Runs the command on its arguments (those after "profile"); returns the exit status. Throws
// InputError("<command line>", flag, expected) for bad arguments, InputError(file, ...) for a
// bad config.
int cmd_profile(const std::vector<std::string>& args);

// Measures the profile of cfg's model (see above) with `repeat` ≥ 1 timed rounds per figure,
// one entry per micro-batch size (empty: cfg.train.micro_batch_size). The JSON `strata profile`
// writes; profile_from_json(make_profile(...), ...) reads it.
nlohmann::json make_profile(const Config& cfg, int repeat,
                            const std::vector<int>& micro_batch_sizes = {});

// The planner's prediction for cfg as it stands on one rank of `cluster` with the measured
// `profile` in place of the analytical compute model: a plan entry of docs/contracts.md's plan
// format (predicted.iteration_s, ...). What predict_for_config (cmd_plan.h) gives with world size
// 1, plus the profile.
nlohmann::json predict_with_profile(const Config& cfg, const Cluster& cluster,
                                    const Profile& profile);

}  // namespace strata
