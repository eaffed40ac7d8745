// bench_checkpoint — checkpoint write and read throughput for GPT-2 350M (24 layers, hidden
// 1024, 16 heads, vocabulary 50257 padded to 50304, sequence 1024): fp32 parameters + AdamW m
// + v, one rank (t = p = d = 1), so one rank_0.safetensors of ~4.2 GB.
//
// Write: save_checkpoint end to end (serialise, CRC-32, write, fsync, rename, latest). Read:
// verify_checkpoint (re-reads and checksums every byte) + read_checkpoint + assembling the full
// tensors. Beside them, in the same run: a plain sequential write()+fsync of the same number of
// bytes and a plain sequential read, the ceiling of this disk. GB/s = bytes of the shard file /
// seconds (10^9). Reads come from the page cache when the file fits in memory; the plain read
// is measured the same way, so the ratio stays meaningful. Never fails on time.
//
// usage: bench_checkpoint [dir]   (default /tmp/strata_bench_ckpt; removed afterwards)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "launch/train/model_state.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "runtime/comm.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  const World w = init_world(&argc, &argv);
  (void)w;
  const std::string dir = argc > 1 ? argv[1] : "/tmp/strata_bench_ckpt";
  std::filesystem::remove_all(dir);
  ModelConfig mc;
  mc.num_layers = 24;
  mc.hidden_size = 1024;
  mc.num_heads = 16;
  mc.ffn_hidden_size = 4096;
  mc.seq_len = 1024;
  mc.vocab_size = 50257;
  RankShard shard;
  int64_t elems = 0;
  const ParamLayout layout =
      model_layout(mc, 1, 0, false, whole_model(mc.num_layers));
  for (const ParamInfo& p : layout.infos()) {
    shard.meta[p.name] = {p.full_shape, p.shape, "replicated", 0, 1};
    for (const char* kind : {"param", "m", "v"}) {
      std::vector<float> v(static_cast<size_t>(p.numel));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977) * 1e-3f;
      shard.pieces.push_back({kind, p.name, 0, std::move(v)});
    }
    elems += 3 * p.numel;
  }
  const double gb = static_cast<double>(elems) * 4 / 1e9;
  std::printf("GPT-2 350M: %.1f M parameters (vocabulary padded), params + m + v = %.2f GB\n",
              static_cast<double>(elems) / 3e6, gb);

  auto comm = make_world_communicator(CommBackend::kLocal, 600);
  auto t0 = Clock::now();
  const std::string path = save_checkpoint(*comm, dir, 1, shard, {{"world_size", 1}}, 1);
  const double t_write = since(t0);
  shard = RankShard();

  t0 = Clock::now();
  const std::string why = verify_checkpoint(path);
  const double t_verify = since(t0);
  t0 = Clock::now();
  double t_assemble = 0;
  {
    const LoadedCheckpoint c = read_checkpoint(path);
    const double t_parse = since(t0);
    const auto t1 = Clock::now();
    for (const char* kind : {"param", "m", "v"}) {
      const FullTensors f = assemble_full(c.shards, kind, {}, path);
      (void)f;
    }
    t_assemble = since(t1);
    t_assemble += t_parse;
  }
  std::filesystem::remove_all(dir);

  // The plain sequential write and read of as many bytes.
  std::filesystem::create_directories(dir);
  const std::string plain = dir + "/plain.bin";
  std::vector<char> buf(static_cast<size_t>(elems) * 4, 1);
  t0 = Clock::now();
  {
    const int fd = ::open(plain.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t done = 0;
    while (done < buf.size()) {
      const ssize_t n = ::write(fd, buf.data() + done, buf.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::fsync(fd);
    ::close(fd);
  }
  const double t_plain_w = since(t0);
  t0 = Clock::now();
  {
    const int fd = ::open(plain.c_str(), O_RDONLY);
    size_t done = 0;
    while (done < buf.size()) {
      const ssize_t n = ::read(fd, buf.data() + done, buf.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  const double t_plain_r = since(t0);
  std::filesystem::remove_all(dir);

  std::printf(
      "checkpoint write (serialise + CRC-32 + write + fsync + rename): %6.2f s  %5.2f GB/s\n",
      t_write, gb / t_write);
  std::printf(
      "plain sequential write + fsync:                                %6.2f s  %5.2f GB/s\n",
      t_plain_w, gb / t_plain_w);
  std::printf(
      "checkpoint verify (read + CRC-32 of every file)%s:             %6.2f s  %5.2f GB/s\n",
      why.empty() ? "" : " FAILED", t_verify, gb / t_verify);
  std::printf(
      "checkpoint load (read + parse + assemble full tensors):        %6.2f s  %5.2f GB/s\n",
      t_assemble, gb / t_assemble);
  std::printf(
      "checkpoint resume read (verify + load):                        %6.2f s  %5.2f GB/s\n",
      t_verify + t_assemble, gb / (t_verify + t_assemble));
  std::printf(
      "plain sequential read:                                         %6.2f s  %5.2f GB/s\n",
      t_plain_r, gb / t_plain_r);
  finalize_world();
  return 0;
}
