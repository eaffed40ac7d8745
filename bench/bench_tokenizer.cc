// bench_tokenizer — Strata's tokenizer encode throughput (MB/s) on a text file.
//
// The file (repeated --repeat times) is cut into documents at blank lines, the cut
// bench/tokenizer_compare.py makes for tiktoken and Hugging Face tokenizers, and encoded with
// encode_batch on each thread count. Each run loads the tokenizer afresh, so its pre-token cache
// starts cold (the cache warms within the run, as a real data-preparation run's does). Prints
// the best of --runs runs per thread count, one line each:
//     strata threads=1 mb_per_s=52.1 seconds=0.021 ids=341143 bytes=1115394
// MB = 10^6 bytes of input text. Never fails on time.
//
// usage: bench_tokenizer TOKENIZER TEXT [--pattern P] [--repeat N] [--threads 1,2] [--runs R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split_documents(const std::string& text) {
  std::vector<std::string> docs;
  for (size_t from = 0; from < text.size();) {
    size_t to = text.find("\n\n", from);
    to = to == std::string::npos ? text.size() : to + 2;
    docs.push_back(text.substr(from, to - from));
    from = to;
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: bench_tokenizer TOKENIZER TEXT [--pattern P] [--repeat N] "
                 "[--threads 1,2] [--runs R]\n");
    return 2;
  }
  const std::string tok_path = argv[1], text_path = argv[2];
  std::string pattern;
  int repeat = 1, runs = 3;
  std::vector<int> threads = {1, 2};
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--pattern") {
      pattern = v;
    } else if (k == "--repeat") {
      repeat = std::atoi(v.c_str());
    } else if (k == "--runs") {
      runs = std::atoi(v.c_str());
    } else if (k == "--threads") {
      threads.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) threads.push_back(std::atoi(t.c_str()));
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    std::ifstream in(text_path, std::ios::binary);
    if (!in) throw strata::InputError(text_path, "", "a readable text file");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text;
    for (int r = 0; r < repeat; ++r) text += ss.str();
    const std::vector<std::string> docs = split_documents(text);
    std::printf("# %s on %s x%d: %zu bytes, %zu documents\n", tok_path.c_str(), text_path.c_str(),
                repeat, text.size(), docs.size());
    for (int t : threads) {
      double best = 1e30;
      size_t ids = 0;
      for (int r = 0; r < runs; ++r) {
        const auto tok = strata::Tokenizer::load(tok_path, pattern);  // a cold cache
        const auto t0 = Clock::now();
        const auto out = tok->encode_batch(docs, t);
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
        ids = 0;
        for (const auto& d : out) ids += d.size();
      }
      std::printf("strata threads=%d mb_per_s=%.1f seconds=%.4f ids=%zu bytes=%zu\n", t,
                  text.size() / best / 1e6, best, ids, text.size());
    }
  } catch (const strata::InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
