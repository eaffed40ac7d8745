// bench_generate — decoding with the key/value cache: the time of each new token as the output
// grows (flat with a cache; growing with the prefix without one) and decode tokens/s.
//
//   bench_generate [--hf DIR] [--set k=v ...] [--new N] [--threads T]
//
// The model: a Hugging Face directory (as strata generate reads it), else the config keys of
// --set (default: a GPT of 6 layers × 512, seq 1024, vocab 50257, random weights). One prompt
// token, then N (default 512) greedy steps; prints the median ms per token around token 16 and
// around token N, their ratio, and tokens/s over the N steps. bench/generate_compare.py runs
// transformers' generate on the same model beside it. Prints figures; never passes or fails.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/model_state.h"
#include "models/hf_checkpoint.h"
#include "models/registry.h"
#include "runtime/backend/backend.h"

int main(int argc, char** argv) {
  using namespace strata;
  std::string hf;
  std::vector<std::string> sets = {"model.num_layers=6", "model.hidden_size=512",
                                   "model.num_heads=8", "model.seq_len=1024"};
  int new_tokens = 512, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--hf") hf = v;
    if (a == "--set") sets.push_back(v);
    if (a == "--new") new_tokens = std::stoi(v);
    if (a == "--threads") threads = std::stoi(v);
  }
  ModelConfig m = hf.empty() ? load_config("", sets).model
                             : model_config_from_hf(read_hf_config(hf), hf + "/config.json");
  std::unique_ptr<Backend> be = make_backend("cpu", threads);
  ModelOptions o;
  o.seed = 1;
  std::unique_ptr<Model> model = build_model(m, o, *be);
  if (!hf.empty()) {
    ParamStore& ps = model->params();
    std::vector<float> host(static_cast<size_t>(ps.numel()));
    fill_params(ps.layout(), load_hf_model(m, hf), host, hf);
    be->upload(ps.params(), host.data());
  }
  std::unique_ptr<GenerationState> st = model->start_generation(1, new_tokens + 1);
  std::vector<double> ms;
  int32_t next = 1;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int n = 0; n < new_tokens; ++n) {
    const auto t0 = Clock::now();
    const std::vector<float> logits = model->decode(*st, {next}, 1);
    next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  auto median = [&](int from, int to) {
    std::vector<double> w(ms.begin() + std::max(0, from),
                          ms.begin() + std::min<int>(to, ms.size()));
    std::nth_element(w.begin(), w.begin() + w.size() / 2, w.end());
    return w[w.size() / 2];
  };
  const double early = median(8, 24), late = median(new_tokens - 16, new_tokens);
  std::printf("model: %d layers, hidden %d, %d heads, vocab %d; %d thread(s)\n", m.num_layers,
              m.hidden_size, m.num_heads, m.vocab_size, threads);
  std::printf(
      "per-token ms: at token 16 %.3f, at token %d %.3f (ratio %.2f); decode %.1f "
      "tokens/s over %d tokens\n",
      early, new_tokens, late, late / early, new_tokens / total, new_tokens);
  return 0;
}
