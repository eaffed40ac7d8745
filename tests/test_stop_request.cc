// SIGTERM / SIGUSR1 during training (launch/train/stop_request.h), in one process: the signal is
// agreed on one iteration after it arrives, whichever thread the kernel runs the handler on (a
// process-directed signal goes to any thread that does not block it: the training thread, the
// data prefetch thread, a library's thread); and `strata train` given SIGUSR1 mid-run saves the
// iteration it stopped after and exits with status 4. The multi-rank agreement is
// tests/mpi_stop_signal.sh. In scripts/sanitize's ThreadSanitizer list: the handler's write and
// the training thread's read of the signal must not race.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "launch/train/stop_request.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace {

TEST(StopRequest, TheSignalIsAgreedOneIterationAfterItArrives) {
  for (const int sig : {SIGUSR1, SIGTERM}) {
    auto world = make_world_communicator(CommBackend::kLocal, 5);
    StopRequest stop(*world);
    EXPECT_EQ(stop.poll().signal, 0);
    EXPECT_EQ(stop.poll().signal, 0);
    ASSERT_EQ(::raise(sig), 0);  // handled on this thread, before raise returns
    EXPECT_EQ(stop.poll().signal, 0) << "the exchange of this iteration carries it";
    EXPECT_EQ(stop.poll().signal, sig) << signal_name(sig);
  }
}

// The handler runs on the thread the signal is sent to; the training thread must see it.
TEST(StopRequest, AHandlerOnAnotherThreadReachesTheTrainingThread) {
  auto world = make_world_communicator(CommBackend::kLocal, 5);
  StopRequest stop(*world);
  std::thread other([] { ::raise(SIGUSR1); });
  int agreed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (agreed == 0 && std::chrono::steady_clock::now() < deadline) {
    agreed = stop.poll().signal;  // the training thread's end of an iteration
    std::this_thread::yield();
  }
  other.join();
  EXPECT_EQ(agreed, SIGUSR1);
}

// `strata train` on one rank: SIGUSR1 after a few iterations, whatever thread takes it (the
// data prefetch thread runs beside the step), ends the run with the checkpoint of the
// iteration it stopped after and status 4.
TEST(StopRequest, TrainSavesAndExitsWithStatus4OnSIGUSR1) {
  char tmpl[] = "/tmp/strata_stop_XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  const std::string config = (dir / "config.json").string();
  const std::string metrics = (dir / "metrics.jsonl").string();
  const std::string log = (dir / "out.txt").string();
  std::ofstream(config) << R"({"model": {"preset": "tiny"},
    "train": {"micro_batch_size": 2, "global_batch_size": 4, "iterations": 100000,
              "threads": 1, "eval_interval": 0},
    "data": {"source": "synthetic"}, "log": {"interval": 100000}})";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string ckpt = "checkpoint.dir=" + (dir / "ckpt").string();
    const std::string metrics_set = "log.metrics=" + metrics;
    std::freopen(log.c_str(), "w", stdout);
    ::dup2(::fileno(stdout), 2);
    ::execl(STRATA_BIN_PATH, STRATA_BIN_PATH, "train", "--config", config.c_str(), "--set",
            ckpt.c_str(), "--set", metrics_set.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  auto lines = [&] {
    std::ifstream in(metrics);
    int n = 0;
    for (std::string l; std::getline(in, l);) ++n;
    return n;
  };
  // Running for a while (the time depends on the build: the sanitizers' are much slower).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (lines() < 5 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(::kill(pid, SIGUSR1), 0);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "strata train did not stop";
  }
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 4) << out;
  const int stopped_after = lines();  // one metrics line per iteration, the last one included
  EXPECT_NE(out.find("stopped by SIGUSR1 after iteration " + std::to_string(stopped_after) + ":"),
            std::string::npos)
      << out;
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt" / ("iter_" + std::to_string(stopped_after)) /
                                      "metadata.json"))
      << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
