// bench_data — the data path's figures: writing an indexed dataset, the loader's tokens/s, and
// (with bench/data_memory.sh) whether host memory grows with the corpus.
//
//   bench_data write PREFIX MB [VOCAB]   a dataset of random documents (lengths 100–10000
//                                        tokens, ids below VOCAB, default 50257) of about MB
//                                        megabytes of tokens, written with IndexedDatasetWriter
//   bench_data read PREFIX [SEQ] [BATCH] [ITERS]
//                                        the training loader's sampling (data.source "indexed",
//                                        Megatron's GPT dataset) of ITERS global batches: tokens/s
//
// Prints figures; never passes or fails on time.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "runtime/data/data_source.h"
#include "runtime/data/indexed.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int write(const std::string& prefix, double mb, int vocab) {
  const int bytes = strata::optimal_token_bytes(vocab);
  strata::IndexedDatasetWriter w(prefix, bytes);
  std::mt19937_64 rng(1);
  const int64_t target = static_cast<int64_t>(mb * 1e6 / bytes);
  std::vector<int32_t> doc;
  const auto t0 = Clock::now();
  while (w.num_tokens() < target) {
    doc.resize(100 + rng() % 9900);
    for (int32_t& t : doc) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    w.add_document(doc.data(), static_cast<int64_t>(doc.size()));
  }
  w.finish();
  const double s = seconds_since(t0);
  std::printf("wrote %s: %lld documents, %lld tokens (%d bytes each), %.1f MB/s\n", prefix.c_str(),
              static_cast<long long>(w.num_documents()), static_cast<long long>(w.num_tokens()),
              bytes, static_cast<double>(w.num_tokens()) * bytes / 1e6 / s);
  return 0;
}

int read(const std::string& prefix, int seq, int batch, int iters) {
  strata::DataConfig d;
  d.source = "indexed";
  d.path = prefix;
  strata::SamplingShape shape;
  shape.seq_len = seq;
  shape.global_batch = batch;
  auto t0 = Clock::now();
  const auto src = strata::make_data_source(d, 1234, shape, "<bench>");
  const double open_s = seconds_since(t0);
  std::vector<int32_t> in(static_cast<size_t>(batch) * seq), tg(in.size());
  t0 = Clock::now();
  for (int it = 0; it < iters; ++it)
    src->sample(strata::Split::kTrain, static_cast<uint64_t>(it), 0, batch, seq, in.data(),
                tg.data());
  const double s = seconds_since(t0);
  std::printf("read %s: opened in %.3f s (%s); %d batches of %d × %d: %.2f M tokens/s\n",
              prefix.c_str(), open_s, src->describe().c_str(), iters, batch, seq,
              static_cast<double>(iters) * batch * seq / s / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() >= 3 && a[0] == "write")
    return write(a[1], std::stod(a[2]), a.size() > 3 ? std::stoi(a[3]) : 50257);
  if (a.size() >= 2 && a[0] == "read")
    return read(a[1], a.size() > 2 ? std::stoi(a[2]) : 1024, a.size() > 3 ? std::stoi(a[3]) : 32,
                a.size() > 4 ? std::stoi(a[4]) : 200);
  std::fprintf(stderr,
               "usage: bench_data write PREFIX MB [VOCAB] | read PREFIX [SEQ] [BATCH] [ITERS]\n");
  return 2;
}
