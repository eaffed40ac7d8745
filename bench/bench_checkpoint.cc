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
// Then the resharded load of one rank of another layout — tensor 2, rank 0, pipeline stage 0 of 2
// (layers 0-11 and the embedding) — two ways in the same run: through CheckpointReader (each rank
// reads only the byte ranges of what it holds: load_params / load_state) and the way resumes
// worked before (read_checkpoint: every file whole, then the full tensors of its parameters).
// Peak host memory is the process's VmHWM, reset before each (/proc/self/clear_refs), less the
// resident memory before it: what the load itself adds on top of the rank's own buffers.
//
// usage: bench_checkpoint [dir]   (default /tmp/strata_bench_ckpt; removed afterwards)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "launch/train/model_state.h"
#include "models/registry.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/comm.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Bytes of a /proc/self/status field (kB there).
double status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(std::string(key).size())) * 1024.0;
  return 0;
}

// Resets the peak resident memory to the present one (Linux ≥ 4.0).
void reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
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
  const ParamLayout layout = model_layout(mc, 1, 0, false, whole_model(mc.num_layers));
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
  // A run state with every key strata train writes (the reader checks them all).
  const nlohmann::json run_state = {
      {"format", "strata-run-state-1"},
      {"iteration", 1},
      {"optimizer_steps", 1},
      {"data_position", 1},
      {"seed", 1},
      {"rng", "none"},
      {"nonfinite_in_a_row", 0},
      {"world_size", 1},
      {"model", {{"arch", "gpt"}}},
      {"parallel",
       {{"tensor", 1},
        {"pipeline", 1},
        {"data", 1},
        {"virtual_stages", 1},
        {"schedule", "1f1b"},
        {"sequence_parallel", false},
        {"distributed_optimizer", false}}},
      {"train", {{"iterations", 1}, {"micro_batch_size", 1}, {"global_batch_size", 1}}},
      {"config_file", "bench_checkpoint"}};
  const std::string path = save_checkpoint(*comm, dir, 1, shard, run_state, 1);
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

  // The resharded load of one rank of (t 2, p 2): rank 0 of the first stage's tensor group.
  const int64_t file_bytes =
      static_cast<int64_t>(std::filesystem::file_size(path + "/rank_0.safetensors"));
  const ParamLayout target = model_layout(mc, 2, 0, false, {{0, 12, true, false}});
  std::vector<OptSegment> segs;
  for (const ParamInfo& p : target.infos()) segs.push_back({p.offset, p.offset, p.numel, p.decay});
  const double own = 3.0 * static_cast<double>(target.numel()) * 4;
  double ranged_s = 0, ranged_peak = 0, ranged_read = 0, whole_s = 0, whole_peak = 0;
  {
    std::vector<float> params(static_cast<size_t>(target.numel())), m(params.size()),
        v(params.size());
    const double before = status_bytes("VmRSS:");
    reset_peak();
    t0 = Clock::now();
    CheckpointReader reader(path);
    load_params(target, reader, "param", params);
    load_state(target, reader, "m", segs, m);
    load_state(target, reader, "v", segs, v);
    ranged_s = since(t0);
    ranged_peak = status_bytes("VmHWM:") - before;
    ranged_read = static_cast<double>(reader.bytes_read());
  }
  {
    std::vector<float> params(static_cast<size_t>(target.numel())), m(params.size()),
        v(params.size());
    const double before = status_bytes("VmRSS:");
    reset_peak();
    t0 = Clock::now();
    std::set<std::string> names;
    for (const ParamInfo& p : target.infos()) names.insert(p.name);
    const LoadedCheckpoint c = read_checkpoint(path);
    fill_params(target, assemble_full(c.shards, "param", names, path), params, path);
    fill_state(target, assemble_full(c.shards, "m", names, path), segs, m, path);
    fill_state(target, assemble_full(c.shards, "v", names, path), segs, v, path);
    whole_s = since(t0);
    whole_peak = status_bytes("VmHWM:") - before;
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
  std::printf(
      "\nresharded load of one rank of (t 2, p 2): its shard (params + m + v) %.2f GB of the "
      "%.2f GB checkpoint\n",
      own / 1e9, static_cast<double>(file_bytes) / 1e9);
  std::printf(
      "  ranges it holds (CheckpointReader):  %6.2f s  read %.2f GB  peak host memory added "
      "%.1f MB\n",
      ranged_s, ranged_read / 1e9, ranged_peak / 1e6);
  std::printf(
      "  every file whole (read_checkpoint):  %6.2f s  read %.2f GB  peak host memory added "
      "%.1f MB\n",
      whole_s, static_cast<double>(file_bytes) / 1e9, whole_peak / 1e6);
  finalize_world();
  return 0;
}
