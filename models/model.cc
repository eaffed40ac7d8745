#include "models/model.h"

#include <stdexcept>

namespace strata {

std::vector<ModelPiece> whole_model(int num_layers) {
  return {ModelPiece{0, num_layers, true, true}};
}

std::unique_ptr<GenerationState> Model::start_generation(int, int64_t) {
  throw std::runtime_error("this model does not generate");
}

Tensor Model::decode_piece(GenerationState&, int, const Tensor&, const std::vector<int32_t>&, int,
                           std::vector<float>*) {
  throw std::runtime_error("this model does not generate");
}

std::vector<float> Model::decode(GenerationState& state, const std::vector<int32_t>& tokens,
                                 int T) {
  const std::vector<ModelPiece>& ps = pieces();
  if (ps.size() != 1 || !ps[0].embedding || !ps[0].head)
    throw std::runtime_error(
        "decode: this rank holds part of the model; decode_over_pipeline runs its pieces");
  std::vector<float> logits;
  decode_piece(state, 0, Tensor(), tokens, T, &logits);
  state.length += T;
  return logits;
}

std::vector<float> decode_over_pipeline(Model& model, Backend& be, Communicator* pipeline,
                                        GenerationState& state, const std::vector<int32_t>& tokens,
                                        int T) {
  const int p = pipeline ? pipeline->size() : 1, stage = pipeline ? pipeline->rank() : 0;
  const int chunks = static_cast<int>(model.pieces().size()), last = chunks * p - 1;
  const Shape boundary{state.batch, T, state.width};
  std::vector<float> logits;
  std::vector<Tensor> sent;  // kept until the end: a device send may still be reading
  Tensor x;
  for (int c = 0; c < chunks; ++c) {
    const int k = c * p + stage;  // the piece's place in the model
    if (k > 0 && p > 1) {
      x = be.empty(boundary, MemCategory::kActivations, model.activation_dtype());
      pipeline->irecv(x, (stage + p - 1) % p).wait();
    }
    Tensor out = model.decode_piece(state, c, x, tokens, T, &logits);
    if (k == last) break;
    if (p > 1) {
      pipeline->isend(out, (stage + 1) % p).wait();
      sent.push_back(std::move(out));
    } else {
      x = std::move(out);
    }
  }
  state.length += T;
  if (p > 1) {  // the last stage's logits to every stage
    Tensor t =
        be.empty({static_cast<int64_t>(state.batch), state.vocab}, MemCategory::kActivations);
    if (stage == p - 1) be.upload(t, logits.data());
    pipeline->broadcast(t, p - 1);
    logits.resize(static_cast<size_t>(t.numel()));
    be.download(logits.data(), t);
  }
  return logits;
}

}  // namespace strata
