#include "launch/config/world_layout.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "models/registry.h"
#include "partitioner/layer_split.h"
#include "runtime/base/error.h"

namespace strata {

namespace {

// A mismatch among `paths`: named at the one the command line set last, if it set any (the
// value the user just changed), else at the first, in the config file.
[[noreturn]] void fail_at(const Config& c, std::initializer_list<std::string> paths,
                          const std::string& expected) {
  const std::vector<std::string>& given = c.command_line_keys;
  for (auto it = given.rbegin(); it != given.rend(); ++it)
    if (std::find(paths.begin(), paths.end(), *it) != paths.end())
      throw InputError("<command line>", *it, expected);
  throw InputError(c.source_file, *paths.begin(), expected);
}

}  // namespace

void validate_for_world(const Config& c, int world_size, const char* world_from) {
  if (world_size < 1) {
    throw std::invalid_argument("validate_for_world: world size " + std::to_string(world_size));
  }
  using std::to_string;
  const std::string& file = c.source_file;
  const ParallelLayout& p = c.layout;
  const int64_t tp = int64_t{p.tensor} * p.context * p.pipeline;
  const std::string world = "world size " + to_string(world_size) + " (" + world_from + ")";
  const std::string tp_text = "tensor " + to_string(p.tensor) +
                              (p.context > 1 ? " × context " + to_string(p.context) : "") +
                              " × pipeline " + to_string(p.pipeline);
  if (world_size % tp != 0) {
    throw InputError(file, "parallel",
                     world + " is not divisible by " + tp_text + " = " + to_string(tp));
  }
  if (p.data > 0 && tp * p.data != world_size) {
    throw InputError(
        file, "parallel.data",
        world + " != " + tp_text + " × data " + to_string(p.data) + " = " + to_string(tp * p.data));
  }

  // Tensor parallelism splits heads, the hidden dimension and the FFN across ranks.
  const ModelConfig& m = c.model;
  const std::string by_tensor = " is not divisible by tensor " + to_string(p.tensor);
  if (m.num_heads % p.tensor != 0) {
    fail_at(c, {"model.num_heads", "parallel.tensor"},
            "num_heads " + to_string(m.num_heads) + by_tensor);
  }
  // Each rank holds whole key/value heads: never replicated or rounded (Megatron refuses too).
  if (m.kv_heads() % p.tensor != 0) {
    fail_at(c, {"model.num_key_value_heads", "parallel.tensor"},
            "num_key_value_heads " + to_string(m.kv_heads()) + by_tensor +
                " (each tensor rank holds whole key/value heads)");
  }
  if (m.hidden_size % p.tensor != 0) {
    fail_at(c, {"model.hidden_size", "parallel.tensor"},
            "hidden_size " + to_string(m.hidden_size) + by_tensor);
  }
  if (m.ffn_hidden_size % p.tensor != 0) {
    fail_at(c, {"model.ffn_hidden_size", "parallel.tensor"},
            "ffn_hidden_size " + to_string(m.ffn_hidden_size) + by_tensor);
  }
  // Sequence parallelism splits the sequence dimension of the activations across the same ranks.
  if (p.sequence_parallel && m.seq_len % p.tensor != 0) {
    throw InputError(file, "parallel.sequence_parallel",
                     "sequence_parallel needs seq_len divisible by tensor: seq_len " +
                         to_string(m.seq_len) + by_tensor);
  }
  // With context parallelism each rank holds seq_len / context positions, which the tensor group
  // splits in turn.
  if (p.sequence_parallel && p.context > 1 && m.seq_len % (int64_t{p.context} * p.tensor) != 0) {
    throw InputError(file, "parallel.sequence_parallel",
                     "sequence_parallel with context " + to_string(p.context) +
                         " needs seq_len divisible by context × tensor = " +
                         to_string(int64_t{p.context} * p.tensor) + ", got seq_len " +
                         to_string(m.seq_len));
  }
  // What the architecture adds (its own keys, its own splits).
  architecture(m.arch).validate(m, p.tensor, file);

  const TrainConfig& t = c.train;
  const int64_t d = data_parallel_size(c, world_size);
  // Expert groups are runs of consecutive data ranks.
  if (d % p.expert != 0) {
    throw InputError(file, "parallel.expert",
                     "expert " + to_string(p.expert) + " does not divide the data-parallel size " +
                         to_string(d) + " (" + world + " / (" + tp_text + "))");
  }
  const int64_t per_step = int64_t{p.micro_batch_size} * d;
  if (t.global_batch_size % per_step != 0) {
    throw InputError(file, "train.global_batch_size",
                     "global_batch_size " + to_string(t.global_batch_size) +
                         " is not divisible by micro_batch_size " + to_string(p.micro_batch_size) +
                         " × data-parallel size " + to_string(d) + " = " + to_string(per_step));
  }
}

ParallelLayout layout_for_world(const Config& c, int world_size) {
  ParallelLayout l = c.layout;
  l.data = data_parallel_size(c, world_size);
  l.num_microbatches = microbatches_per_pipeline(c, world_size);
  // The split training runs (partitioner/layer_split.h), not one the planner would choose.
  l.layers_per_piece =
      layer_split(c.model.num_layers, l.pieces(),
                  c.layout.layers_per_piece.empty()
                      ? std::nullopt
                      : std::optional<std::vector<int>>(c.layout.layers_per_piece));
  return l;
}

int data_parallel_size(const Config& c, int world_size) {
  const ParallelLayout& p = c.layout;
  if (p.data > 0) return p.data;
  return static_cast<int>(world_size / (int64_t{p.tensor} * p.context * p.pipeline));
}

int microbatches_per_pipeline(const Config& c, int world_size) {
  const int d = data_parallel_size(c, world_size);
  // Before validate_for_world a world smaller than tensor x pipeline gives d = 0.
  if (d < 1) return 0;
  return static_cast<int>(c.train.global_batch_size / (int64_t{c.layout.micro_batch_size} * d));
}

}  // namespace strata
