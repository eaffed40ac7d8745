// bench_parallel — data- and tensor-parallel scaling on this machine's cores.
//
// Run under mpirun with 2 ranks (one thread each): first rank 0 trains alone on one core (the
// others wait), then both ranks train the same global batch with data = 2, then with tensor = 2.
// Prints tokens/s of each and the scaling efficiency: parallel tokens/s / (2 × single tokens/s).
// Never fails on time.
//
// usage: mpirun -np 2 build/bench/bench_parallel [iterations]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "runtime/comm/comm.h"

namespace {

strata::Config config(int iters, std::vector<std::string> extra) {
  // GPT with 4 layers, hidden 256, 8 heads, seq 128, vocabulary 256, global batch 16.
  std::vector<std::string> s = {"model.preset=tiny",
                                "model.num_layers=4",
                                "model.hidden_size=256",
                                "model.num_heads=8",
                                "model.ffn_hidden_size=1024",
                                "model.seq_len=128",
                                "model.vocab_size=256",
                                "train.threads=1",
                                "train.micro_batch_size=4",
                                "train.global_batch_size=16",
                                "train.eval_interval=0",
                                "train.iterations=" + std::to_string(iters),
                                "data.synthetic.vocab_size=256",
                                "data.synthetic.order=1",
                                "log.interval=100000"};
  s.insert(s.end(), extra.begin(), extra.end());
  return strata::load_config("", s);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  const World w = init_world(&argc, &argv);
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  auto host = make_world_communicator(w.size > 1 ? CommBackend::kMPI : CommBackend::kLocal, 600);
  RunContext quiet;
  quiet.verbose = false;

  double single = 0;
  if (w.rank == 0) {
    RunContext solo = quiet;
    solo.single_process = true;
    single = run_training(config(iters, {}), solo).tokens_per_s;
  }
  host->barrier();
  if (w.size != 2) {
    if (w.rank == 0) std::printf("bench_parallel: run with mpirun -np 2 (world is %d)\n", w.size);
    finalize_world();
    return 0;
  }
  const double dp = run_training(config(iters, {}), quiet).tokens_per_s;
  const double tp = run_training(config(iters, {"parallel.tensor=2"}), quiet).tokens_per_s;
  const double tpsp =
      run_training(config(iters, {"parallel.tensor=2", "parallel.sequence_parallel=true"}), quiet)
          .tokens_per_s;
  if (w.rank == 0) {
    std::printf(
        "bench_parallel: GPT 4 layers, hidden 256, 8 heads, seq 128, global batch 16, "
        "%d iterations, 1 thread per rank\n",
        iters);
    std::printf("  1 process, 1 core      %9.0f tokens/s\n", single);
    std::printf("  data 2   (2 ranks)     %9.0f tokens/s   efficiency %.2f\n", dp,
                dp / (2 * single));
    std::printf("  tensor 2 (2 ranks)     %9.0f tokens/s   efficiency %.2f\n", tp,
                tp / (2 * single));
    std::printf("  tensor 2 + sequence    %9.0f tokens/s   efficiency %.2f\n", tpsp,
                tpsp / (2 * single));
  }
  host.reset();
  finalize_world();
  return 0;
}
