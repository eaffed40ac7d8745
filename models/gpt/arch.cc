// The "gpt" entry of the model registry (models/registry.h).
#include "models/gpt/gpt.h"
#include "models/registry.h"

namespace strata {

ArchSpec gpt_arch() {
  ArchSpec a;
  a.name = "gpt";
  a.describe = describe_gpt;
  a.build = [](const ModelConfig& m, const ModelOptions& o, Backend& be) -> std::unique_ptr<Model> {
    return std::make_unique<GptModel>(gpt_shape(m), o, be);
  };
  a.hf = HfAdapter{"GPT2LMHeadModel", gpt_to_hf, gpt_from_hf, {}, {}};
  // GPT's keys are the generic ones that launch/config/config_parse.cc validates for every model.
  a.validate = [](const ModelConfig&, int, const std::string&) {};
  return a;
}

}  // namespace strata
