// bench_comm — the cost of the Communicator over raw MPI, under `mpirun -np 2` (or more).
//
// For message sizes 1 KiB ... 64 MiB (powers of 4), the same operation three ways, interleaved in
// one run (blocks of iterations alternate, and which goes first alternates) so that drift of the
// machine hits all three alike:
//   comm     through Communicator (MPI backend: the operation started non-blocking and polled
//            against the watchdog deadline; all_reduce as its ring of MPI_Isend/MPI_Irecv)
//   mpi      raw blocking MPI (MPI_Send/MPI_Recv, MPI_Allreduce)
//   mpi-nb   raw non-blocking MPI + MPI_Wait (MPI_Isend/MPI_Irecv, MPI_Iallreduce): what the
//            Communicator would cost with Open MPI's own non-blocking algorithms
// ratio = comm / mpi; the target is <= 1.05 at 1 MiB and above.
//
// send/recv is a ping-pong between ranks 0 and 1 (other ranks idle); time is one way, half a
// round trip. all_reduce is in place, f32 sum, over all ranks; time is the slowest rank's.
// Bandwidth: send/recv bytes / t; all_reduce bus bandwidth 2 (p - 1) / p · bytes / t
// (nccl-tests' formula, comparable across rank counts). Figures are medians over blocks.
//
// This file includes mpi.h although it lives outside runtime/: the baseline is raw MPI by
// definition. Nothing here is used by Strata itself.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "runtime/comm/comm.h"

namespace {

using strata::Communicator;
using strata::DType;
using strata::ReduceOp;

constexpr int kBlocks = 11;  // per way, per size

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per iteration of `body` run `iters` times, the slowest rank's.
double time_block(const std::function<void()>& body, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) body();
  double t = (MPI_Wtime() - t0) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

struct Row {
  const char* op;
  size_t bytes;
  double comm, mpi, mpi_nb;  // seconds
};

// Runs the ways in interleaved blocks; returns the median seconds per iteration of each.
std::vector<double> interleaved(const std::vector<std::function<void()>>& ways, int iters) {
  for (const auto& w : ways) w();  // warm-up: connections, buffers, algorithm selection
  std::vector<std::vector<double>> t(ways.size());
  for (int b = 0; b < kBlocks; ++b) {
    for (size_t k = 0; k < ways.size(); ++k) {
      const size_t w = (b % 2 == 0) ? k : ways.size() - 1 - k;
      t[w].push_back(time_block(ways[w], iters));
    }
  }
  std::vector<double> out;
  for (auto& v : t) out.push_back(median(v));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const strata::World w = strata::init_world(&argc, &argv);
  if (w.size < 2) {
    std::fprintf(stderr, "bench_comm: run under mpirun -np 2 (or more); world size is %d\n",
                 w.size);
    strata::finalize_world();
    return 2;
  }
  std::vector<Row> rows;
  {
    auto comm = strata::make_world_communicator(strata::CommBackend::kMPI, 300);
    const int me = w.rank, p = w.size;
    for (size_t bytes = 1024; bytes <= (size_t{64} << 20); bytes *= 4) {
      const size_t n = bytes / sizeof(float);
      const int n_int = static_cast<int>(n);
      std::vector<float> a(n, 0.0f), b(n, 0.0f);
      // Enough iterations for ~10 ms blocks at shared-memory speeds, at least 2.
      const int iters =
          static_cast<int>(std::max<size_t>(2, std::min<size_t>(2000, (size_t{32} << 20) / bytes)));

      // Ping-pong between ranks 0 and 1; `tag` keeps the ways apart.
      auto pp_comm = [&] {
        if (me == 0) {
          comm->send(a.data(), n, DType::kF32, 1);
          comm->recv(b.data(), n, DType::kF32, 1);
        } else if (me == 1) {
          comm->recv(b.data(), n, DType::kF32, 0);
          comm->send(a.data(), n, DType::kF32, 0);
        }
      };
      auto pp_mpi = [&] {
        if (me == 0) {
          MPI_Send(a.data(), n_int, MPI_FLOAT, 1, 7, MPI_COMM_WORLD);
          MPI_Recv(b.data(), n_int, MPI_FLOAT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (me == 1) {
          MPI_Recv(b.data(), n_int, MPI_FLOAT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(a.data(), n_int, MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
        }
      };
      auto pp_mpi_nb = [&] {
        MPI_Request r;
        if (me == 0) {
          MPI_Isend(a.data(), n_int, MPI_FLOAT, 1, 8, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
          MPI_Irecv(b.data(), n_int, MPI_FLOAT, 1, 8, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
        } else if (me == 1) {
          MPI_Irecv(b.data(), n_int, MPI_FLOAT, 0, 8, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
          MPI_Isend(a.data(), n_int, MPI_FLOAT, 0, 8, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
        }
      };
      std::vector<double> t = interleaved({pp_comm, pp_mpi, pp_mpi_nb}, iters);
      rows.push_back({"send/recv", bytes, t[0] / 2, t[1] / 2, t[2] / 2});

      // All-reduce of zeros: the values stay finite however often it runs.
      auto ar_comm = [&] { comm->all_reduce(a.data(), n, DType::kF32, ReduceOp::kSum); };
      auto ar_mpi = [&] {
        MPI_Allreduce(MPI_IN_PLACE, a.data(), n_int, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      };
      auto ar_mpi_nb = [&] {
        MPI_Request r;
        MPI_Iallreduce(MPI_IN_PLACE, a.data(), n_int, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      };
      t = interleaved({ar_comm, ar_mpi, ar_mpi_nb}, iters);
      rows.push_back({"all_reduce", bytes, t[0], t[1], t[2]});
    }
    if (me == 0) {
      std::printf("bench_comm: %d ranks on %s, MPI backend, f32, median of %d blocks\n", p,
                  w.host.c_str(), kBlocks);
      std::printf("%-10s %9s %11s %11s %11s %8s %8s %10s\n", "op", "bytes", "comm us", "mpi us",
                  "mpi-nb us", "ratio", "vs nb", "comm GB/s");
      double log_sum = 0, worst = 0;
      int big = 0;
      for (const Row& r : rows) {
        const double bw_bytes =
            std::string(r.op) == "all_reduce" ? 2.0 * (p - 1) / p * r.bytes : double(r.bytes);
        const double ratio = r.comm / r.mpi;
        std::printf("%-10s %9zu %11.2f %11.2f %11.2f %8.3f %8.3f %10.2f\n", r.op, r.bytes,
                    r.comm * 1e6, r.mpi * 1e6, r.mpi_nb * 1e6, ratio, r.comm / r.mpi_nb,
                    bw_bytes / r.comm / 1e9);
        if (r.bytes >= (size_t{1} << 20)) {
          log_sum += std::log(ratio);
          worst = std::max(worst, ratio);
          ++big;
        }
      }
      std::printf("ratio comm/mpi at >= 1 MiB: geometric mean %.3f, worst %.3f (target <= 1.05)\n",
                  std::exp(log_sum / big), worst);
    }
  }
  strata::finalize_world();
  return 0;
}
