// The strata command as a user meets it: exit statuses, the one-line error format of
// docs/contracts.md for bad configs and bad data files, --help, --version, --dry-run and the
// metrics file. Runs the real binary (STRATA_BIN_PATH) in a subprocess.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "launch/train/reporting.h"
#include "runtime/checkpoint/shard.h"
#include "runtime/data/indexed.h"
#include "runtime/data/tokenizer.h"
#include "small_disk.h"

namespace {

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

// A shell command line's status and output (stdout and stderr together).
Result run_shell(const std::string& cmd) {
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// env: "NAME=VALUE" assignments the command runs with.
Result run(const std::string& args, const std::string& env = "") {
  return run_shell((env.empty() ? "" : "env " + env + " ") + std::string(STRATA_BIN_PATH) + " " +
                   args + " 2>&1");
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_cli_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The text source of the tokenizer tests: one line of Hamlet 200 times, as corpus.txt.
  std::string write_hamlet() {
    std::string text;
    for (int i = 0; i < 200; ++i)
      text += "To be, or not to be, that is the question: whether 'tis nobler in the mind.\n";
    return write("corpus.txt", text);
  }
  static std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The prompt and generated ids of a `generate --json` run.
  static std::string generated_ids(const Result& g) {
    const nlohmann::json j = nlohmann::json::parse(g.out.substr(g.out.rfind("{\"")));
    return j["prompt_ids"].dump() + " " + j["ids"].dump();
  }
  // A small valid config; `extra` is merged over it.
  std::string config(const nlohmann::json& extra = nlohmann::json::object()) {
    nlohmann::json j = {{"model", {{"preset", "tiny"}}},
                        {"train",
                         {{"micro_batch_size", 2},
                          {"global_batch_size", 4},
                          {"iterations", 3},
                          {"eval_interval", 0}}},
                        {"data", {{"source", "synthetic"}}},
                        {"log", {{"interval", 1}}}};
    j.merge_patch(extra);
    return write("config.json", j.dump(2));
  }
  // The single line an InputError must print.
  static std::string error_line(const std::string& out) {
    std::istringstream is(out);
    std::string line, found;
    int count = 0;
    while (std::getline(is, line))
      if (line.rfind("error: ", 0) == 0) {
        found = line;
        ++count;
      }
    EXPECT_EQ(count, 1) << "expected exactly one error line in:\n" << out;
    return found;
  }
  std::string dir_;
};

TEST_F(Cli, VersionListsBackends) {
  Result r = run("--version");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("strata "), std::string::npos);
  EXPECT_NE(r.out.find("backends: cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cpu: OpenBLAS "), std::string::npos) << r.out;
}

// A core the environment names is the one OpenBLAS runs (kernels/cpu/blas.h), and --version and
// the banner say so; without one, the core is the CPU features' and the variable stays unset for
// the programs Strata starts.
TEST_F(Cli, CpuKernelsFollowOpenblasCoretype) {
  // OpenBLAS falls back from a core the CPU cannot run: name only cores this one can.
  const strata::kernels::cpu::X86Features f = strata::kernels::cpu::x86_features();
  if (!f.avx2_fma)
    GTEST_SKIP() << "this CPU has no AVX2 and FMA: the Haswell and Sandybridge cores";
  Result named = run("--version", "OPENBLAS_CORETYPE=Sandybridge");
  EXPECT_EQ(named.status, 0) << named.out;
  EXPECT_NE(named.out.find("Sandybridge kernels (chosen by OPENBLAS_CORETYPE)"), std::string::npos)
      << named.out;
  Result banner =
      run("train --config " + config() + " --set train.iterations=1", "OPENBLAS_CORETYPE=Haswell");
  EXPECT_EQ(banner.status, 0) << banner.out;
  EXPECT_NE(banner.out.find("backend  cpu (OpenBLAS "), std::string::npos) << banner.out;
  EXPECT_NE(banner.out.find(" Haswell, "), std::string::npos) << banner.out;
}

// A config's relative paths count from its folder (the test runs elsewhere: the build folder),
// --set's from the current directory, and an error about one says which.
TEST_F(Cli, ConfigPathsCountFromTheConfigsFolder) {
  write("corpus.txt", std::string(4000, 'a') + "\n");
  const nlohmann::json text = {{"model", {{"vocab_size", 256}}},
                               {"train", {{"iterations", 1}}},
                               {"data", {{"source", "text"}, {"path", "corpus.txt"}}},
                               {"log", {{"metrics", "m.jsonl"}}}};
  Result r = run("train --config " + config(text));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/m.jsonl")) << "metrics beside the config";

  r = run("train --config " + config({{"model", {{"vocab_size", 256}}},
                                      {"data", {{"source", "text"}, {"path", "no/corpus.txt"}}}}));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(error_line(r.out),
            "error: " + dir_ + "/config.json: data.path: an existing file, cannot find '" + dir_ +
                "/no/corpus.txt': No such file or directory (data.path \"no/corpus.txt\", "
                "relative to the config file's folder " +
                dir_ + ")");

  r = run("train --config " + config(text) + " --set data.path=no-such-corpus.txt");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(error_line(r.out),
            "error: " + dir_ +
                "/config.json: data.path: an existing file, cannot find 'no-such-corpus.txt': No "
                "such file or directory (data.path \"no-such-corpus.txt\", relative to the "
                "current directory " +
                std::filesystem::current_path().string() + ")");

  // A tokenizer the config names: the reader's own error, about the file.
  r = run("train --config " +
          config({{"model", {{"vocab_size", 256}}},
                  {"data",
                   {{"source", "text"}, {"path", "corpus.txt"}, {"tokenizer", "tok/none.json"}}}}));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(error_line(r.out).find(dir_ + "/tok/none.json: "), std::string::npos) << r.out;
  EXPECT_NE(error_line(r.out).find(" (data.tokenizer \"tok/none.json\", relative to the config "
                                   "file's folder " +
                                   dir_ + ")"),
            std::string::npos)
      << r.out;
}

TEST_F(Cli, HelpForEveryCommand) {
  for (const char* a : {"--help", "train --help", "plan --help", "schedule --help",
                        "profile --help", "export --help"}) {
    Result r = run(a);
    EXPECT_EQ(r.status, 0) << a << "\n" << r.out;
    EXPECT_NE(r.out.find("usage: strata"), std::string::npos) << a;
  }
}

TEST_F(Cli, UsageErrorsExitTwo) {
  Result none = run("");
  EXPECT_EQ(none.status, 2);
  Result bad = run("frobnicate");
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(error_line(bad.out).rfind("error: <command line>: frobnicate: ", 0), 0u) << bad.out;
  Result noconf = run("train");
  EXPECT_EQ(noconf.status, 2);
  EXPECT_NE(error_line(noconf.out).find("--config"), std::string::npos);
  Result flag = run("train --config x.json --bogus");
  EXPECT_EQ(flag.status, 2);
  EXPECT_NE(error_line(flag.out).find("--bogus"), std::string::npos);
}

// Each bad config: the exit status is 2 and the error line names the file, the JSON path and
// what was expected.
struct BadConfig {
  const char* name;
  const char* json;      // merged over the valid config
  const char* path;      // the JSON path the error must name
  const char* expected;  // a fragment of the explanation
};

TEST_F(Cli, BadConfigsNameFileKeyAndExpectation) {
  const BadConfig cases[] = {
      {"unknown key", R"({"model": {"hidden_sz": 3}})", "model.hidden_sz", "unknown key"},
      {"unknown section", R"({"trian": {}})", "trian", "unknown key"},
      {"wrong type", R"({"train": {"iterations": "many"}})", "train.iterations", "integer"},
      {"out of range", R"({"train": {"micro_batch_size": -3}})", "train.micro_batch_size", ""},
      {"bad enum", R"({"parallel": {"schedule": "zigzag"}})", "parallel.schedule", "1f1b"},
      {"heads", R"({"model": {"num_heads": 5}})", "model", "5"},
      {"layers_per_stage", R"({"parallel": {"pipeline": 2, "layers_per_stage": [1, 2]}})",
       "parallel.layers_per_stage", "3"},
      {"batch", R"({"train": {"global_batch_size": 5}})", "train", "5"},
      {"too big", R"({"model": {"preset": "gpt3-175b"}})", "model", "memory"},
      {"missing data path", R"({"data": {"source": "text"}})", "data.path", ""},
  };
  for (const BadConfig& c : cases) {
    const std::string path = config(nlohmann::json::parse(c.json));
    Result r = run("train --config " + path);
    EXPECT_EQ(r.status, 2) << c.name << ":\n" << r.out;
    const std::string line = error_line(r.out);
    EXPECT_EQ(line.rfind("error: " + path + ": ", 0), 0u) << c.name << ": " << line;
    EXPECT_NE(line.find(c.path), std::string::npos) << c.name << ": " << line;
    EXPECT_NE(line.find(c.expected), std::string::npos) << c.name << ": " << line;
  }
}

TEST_F(Cli, MalformedJsonAndMissingFile) {
  Result missing = run("train --config " + dir_ + "/nope.json");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(error_line(missing.out).find("nope.json"), std::string::npos);
  const std::string broken = write("broken.json", "{\"model\": {\"preset\": \"tiny\",}");
  Result r = run("train --config " + broken);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(error_line(r.out).find("broken.json"), std::string::npos);
}

TEST_F(Cli, BadDataFilesExitTwoWithOffset) {
  // A tokens file whose header promises more tokens than it holds.
  std::string bin(1024 + 2 * 10, '\0');
  const int32_t header[3] = {20240520, 1, 1000};
  std::memcpy(bin.data(), header, sizeof header);
  const std::string truncated = write("short.bin", bin);
  Result r =
      run("train --config " + config({{"data", {{"source", "tokens"}, {"path", truncated}}}}));
  EXPECT_EQ(r.status, 2) << r.out;
  std::string line = error_line(r.out);
  EXPECT_NE(line.find(truncated), std::string::npos) << line;
  EXPECT_NE(line.find("byte"), std::string::npos) << line;

  const int32_t wrong_magic[3] = {12345, 1, 10};
  std::memcpy(bin.data(), wrong_magic, sizeof wrong_magic);
  const std::string magic = write("magic.bin", bin);
  r = run("train --config " + config({{"data", {{"source", "tokens"}, {"path", magic}}}}));
  EXPECT_EQ(r.status, 2) << r.out;
  line = error_line(r.out);
  EXPECT_NE(line.find("20240520"), std::string::npos) << line;

  std::string text(5000, 'a');
  text[3000] = static_cast<char>(0xFF);  // never valid in UTF-8
  const std::string bad_utf8 = write("bad.txt", text);
  r = run("train --config " + config({{"data", {{"source", "text"}, {"path", bad_utf8}}},
                                      {"model", {{"vocab_size", 256}}}}));
  EXPECT_EQ(r.status, 2) << r.out;
  line = error_line(r.out);
  EXPECT_NE(line.find("byte 3000"), std::string::npos) << line;
}

// Progress lines reach a pipe as they are printed (Slurm's output files, `| tee`), not when the
// run ends: the first iteration's line is read while the run still has thousands of steps to go.
// The line carries the mean step time, per-rank FLOP/s, the elapsed time and the ETA.
TEST_F(Cli, ProgressLinesAreFlushedToAPipe) {
  const std::string cfg =
      config({{"train", {{"iterations", 100000}}}, {"log", {{"interval", 50000}}}});
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl(STRATA_BIN_PATH, STRATA_BIN_PATH, "train", "--config", cfg.c_str(), (char*)nullptr);
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while (out.find("\niter ") == std::string::npos && (n = read(fds[0], buf, sizeof buf)) > 0)
    out.append(buf, n);
  int status = 0;
  const pid_t done = waitpid(pid, &status, WNOHANG);
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  close(fds[0]);
  EXPECT_EQ(done, 0) << "the run ended before its first line arrived:\n" << out;
  const size_t at = out.find("\niter ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  EXPECT_NE(line.find("iter     1/100000 | loss "), std::string::npos) << line;
  EXPECT_NE(line.find("FLOP/s per rank | mem "), std::string::npos) << line;
  EXPECT_NE(line.find(", ETA "), std::string::npos) << line;
}

// A Hugging Face directory records no data: `eval --data` needs it named, rather than evaluating
// the built-in synthetic chain without a word. A checkpoint's run state records its run's data
// section, which eval --data reads (shared/DESIGN.md); one saved before it did is refused.
TEST_F(Cli, EvalOfAHuggingFaceDirectoryNeedsItsData) {
  const std::string hf = std::string(STRATA_TEST_DIR) + "/golden/generate/hf_gpt2_tiny";
  Result bare = run("eval --hf " + hf + " --data val --batches 1 --batch-size 1");
  EXPECT_EQ(bare.status, 2) << bare.out;
  EXPECT_NE(error_line(bare.out).find("--data"), std::string::npos) << bare.out;
  EXPECT_NE(bare.out.find("data.source"), std::string::npos) << bare.out;
  Result named =
      run("eval --hf " + hf + " --data val --batches 1 --batch-size 1 --set data.source=synthetic");
  EXPECT_EQ(named.status, 0) << named.out;
  EXPECT_NE(named.out.find("val split:"), std::string::npos) << named.out;
  Result trained = run("train --config " + config() + " --set checkpoint.dir=" + dir_ +
                       "/ck --set checkpoint.interval=3");
  ASSERT_EQ(trained.status, 0) << trained.out;
  const std::string eval = " --data val --batches 2 --batch-size 2 --json";
  Result own = run("eval --checkpoint " + dir_ + "/ck" + eval);
  ASSERT_EQ(own.status, 0) << own.out;
  Result told = run("eval --checkpoint " + dir_ + "/ck --config " + config() + eval);
  ASSERT_EQ(told.status, 0) << told.out;
  EXPECT_EQ(own.out.substr(own.out.rfind("{\"")), told.out.substr(told.out.rfind("{\"")));

  // A run state without the data section (saved before it was recorded): its checksum redone.
  const std::string ck = dir_ + "/ck/iter_3";
  nlohmann::json rs = nlohmann::json::parse(std::ifstream(ck + "/run_state.json"));
  rs.erase("data");
  const std::string text = rs.dump(2) + "\n";
  std::ofstream(ck + "/run_state.json", std::ios::binary) << text;
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(ck + "/metadata.json"));
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", strata::crc32_ieee(text.data(), text.size()));
  meta["files"]["run_state.json"] = {{"bytes", text.size()}, {"crc32", crc}};
  std::ofstream(ck + "/metadata.json", std::ios::binary) << meta.dump(2) << "\n";
  Result old = run("eval --checkpoint " + ck + eval);
  EXPECT_EQ(old.status, 2) << old.out;
  EXPECT_NE(error_line(old.out).find("iter_3/run_state.json: data: the run's data section"),
            std::string::npos)
      << old.out;
  Result named_old = run("eval --checkpoint " + ck + " --config " + config() + eval);
  EXPECT_EQ(named_old.status, 0) << named_old.out;
}

// A finished run started again says so, rather than printing its header and nothing else.
TEST_F(Cli, AFinishedRunStartedAgainSaysItIsComplete) {
  const std::string cfg = config();
  const std::string ck = " --set checkpoint.dir=" + dir_ + "/ck --set checkpoint.interval=3";
  ASSERT_EQ(run("train --config " + cfg + ck).status, 0);
  Result again = run("train --config " + cfg + ck);
  EXPECT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("already complete: resumed at iteration 3 of 3"), std::string::npos)
      << again.out;
  EXPECT_EQ(again.out.find("iter "), std::string::npos) << again.out;
}

// plan --model CONFIG plans the config as written: its precision and global batch, and its
// micro-batch pinned; a cluster without the precision's peak says which precision it has.
TEST_F(Cli, PlanOfAConfigTakesItsPrecisionAndBatch) {
  const std::string cfg = config(
      {{"train", {{"precision", "fp32"}, {"global_batch_size", 8}, {"micro_batch_size", 2}}}});
  Result r = run("plan --model " + cfg + " --cluster cpu-local --json " + dir_ + "/p.json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("global batch 8:"), std::string::npos) << r.out;
  const nlohmann::json plan = nlohmann::json::parse(std::ifstream(dir_ + "/p.json"));
  EXPECT_EQ(plan["precision"], "fp32") << plan.dump();
  EXPECT_EQ(plan["plans"][0]["micro_batch_size"], 2) << plan.dump();
  Result bf16 = run("plan --model gpt2-124m --cluster cpu-local --global-batch-size 8");
  EXPECT_EQ(bf16.status, 2) << bf16.out;
  EXPECT_NE(error_line(bf16.out).find("--precision fp32"), std::string::npos) << bf16.out;
}

// The lines of `out` after the one starting with `header` (up to a blank line or the end).
std::vector<std::string> lines_after(const std::string& out, const std::string& header) {
  std::istringstream is(out);
  std::string line;
  std::vector<std::string> found;
  bool in = false;
  while (std::getline(is, line)) {
    if (in && line.empty()) break;
    if (in) found.push_back(line);
    if (line.rfind(header, 0) == 0) in = true;
  }
  return found;
}

// Llama 3.1 405B on one DGX H100 node: no plan fits (exit 0, as docs/contracts.md says). The
// families are listed a reason a line, each reason once, the interleaved ones with 4 or 8 stages
// refused for the 126 layers that do not split into p·v chunks; the last line is the bottom line
// the planner found by searching more nodes.
TEST_F(Cli, PlanRefusalExplainsItselfAndEndsWithTheBottomLine) {
  Result r = run("plan --model llama-3.1-405b --cluster dgx-h100 --global-batch-size 64 --json " +
                 dir_ + "/p.json");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> lines = lines_after(r.out, "no plan fits; reasons by family");
  ASSERT_GE(lines.size(), 2u) << r.out;
  EXPECT_LE(lines.size(), 8u) << r.out;
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()).size(), lines.size()) << r.out;
  EXPECT_EQ(r.out.find("no micro-batch size"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("\n  4 families: 126 layers do not split into p·v equal chunks for any v ≥ 2 "
                 "(interleaved, p in {4, 8})\n"),
      std::string::npos)
      << r.out;
  EXPECT_EQ(lines.back().rfind("bottom line: needs at least ", 0), 0u) << r.out;
  EXPECT_NE(lines.back().find(" nodes of dgx-h100 (8 GPUs each; nothing fits on 1"),
            std::string::npos)
      << r.out;
  const nlohmann::json plan = nlohmann::json::parse(std::ifstream(dir_ + "/p.json"));
  EXPECT_TRUE(plan["plans"].empty());
  ASSERT_EQ(plan["bottom_line"].size(), 1u) << plan.dump();
  EXPECT_EQ("bottom line: " + plan["bottom_line"][0].get<std::string>(), lines.back());
  for (const auto& x : plan["rejected"]) EXPECT_TRUE(x.contains("group")) << x.dump();
}

// Pins that leave the search nothing to try are a refused request: exit 2 and one line naming
// --fix and what excluded everything (before, "searched 0 configurations" and an empty list,
// exit 0).
TEST_F(Cli, PlanPinsThatLeaveNothingAreRefused) {
  Result r =
      run("plan --model gpt2-124m --cluster dgx-h100 --global-batch-size 64 --fix "
          "tensor=2,pipeline=2,data=2,schedule=1f1b,micro_batch_size=3,recompute=none");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(error_line(r.out),
            "error: <command line>: --fix: pins that leave a layout to try, but the search tried "
            "none: t=2 p=2 1f1b: micro_batch_size 3 does not divide the global batch 64 over "
            "data 2 (64 / (b · 2) must be a whole number of micro-batches)");
  EXPECT_EQ(r.out.find("searched 0"), std::string::npos) << r.out;
  Result t3 =
      run("plan --model gpt2-124m --cluster dgx-h100 --global-batch-size 64 --fix tensor=3");
  EXPECT_EQ(t3.status, 2) << t3.out;
  EXPECT_NE(error_line(t3.out).find("--fix: pins that leave a layout to try, but the search tried "
                                    "none: tensor 3 is not a size the search tries"),
            std::string::npos)
      << t3.out;
}

// A pinned layout that fits prints its plan and nothing about refusals; a search with a plan
// lists the others a reason a line, a few lines, not one a family.
TEST_F(Cli, PlanRejectedFamiliesAreAFewLines) {
  Result pinned =
      run("plan --model gpt2-124m --cluster dgx-h100 --global-batch-size 64 --fix "
          "tensor=2,pipeline=2,data=2,schedule=1f1b,virtual_stages=1,micro_batch_size=4,"
          "recompute=none,sequence_parallel=false,distributed_optimizer=false,context=1");
  ASSERT_EQ(pinned.status, 0) << pinned.out;
  EXPECT_NE(pinned.out.find("chosen plan:"), std::string::npos) << pinned.out;
  EXPECT_EQ(pinned.out.find("rejected"), std::string::npos) << pinned.out;
  EXPECT_EQ(pinned.out.find("bottom line"), std::string::npos) << pinned.out;
  Result r = run("plan --model gpt3-175b --cluster dgx-h100 --nodes 16 --global-batch-size 512");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> lines = lines_after(r.out, "rejected families");
  ASSERT_FALSE(lines.empty()) << r.out;
  EXPECT_LE(lines.size(), 12u) << r.out;
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()).size(), lines.size()) << r.out;
}

// docs/generate.md's command: a checkpoint (whose run_state.json records no data) generates from a
// text prompt through --set data.tokenizer, with no text data source beside it.
TEST_F(Cli, GenerateTokenizesPromptsWithoutATextSource) {
  const std::string tok =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  const std::string cfg = config({{"model", {{"vocab_size", 4352}}},
                                  {"train", {{"iterations", 2}}},
                                  {"checkpoint", {{"dir", dir_ + "/ck"}, {"interval", 2}}}});
  ASSERT_EQ(run("train --config " + cfg).status, 0);
  Result r = run("generate --checkpoint " + dir_ + "/ck --set data.tokenizer=" + tok +
                 " --prompt \"To be, or not\" --max-new-tokens 3 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.rfind("{\"")));
  EXPECT_EQ(j["ids"].size(), 3u) << r.out;
  EXPECT_FALSE(j["prompt_ids"].empty()) << r.out;
}

// A run with data.tokenizer saves a copy of it in every checkpoint, so generate and eval read
// text with the run's own tokenizer without being told, and export puts it beside the model,
// where generate --hf finds it: the same ids on all three paths as with --set data.tokenizer.
TEST_F(Cli, CheckpointsCarryTheRunsTokenizerToGenerateAndExport) {
  const std::string tok =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  write_hamlet();
  // data.path relative to the config, and the config relative to the folder train runs in.
  const std::string cfg =
      config({{"model", {{"vocab_size", 4353}}},
              {"train", {{"iterations", 2}}},
              {"data", {{"source", "text"}, {"path", "corpus.txt"}, {"tokenizer", tok}}},
              {"checkpoint", {{"dir", dir_ + "/ck"}, {"interval", 2}}}});
  Result r = run_shell("cd " + dir_ + " && " + std::string(STRATA_BIN_PATH) + " train --config " +
                       std::filesystem::path(cfg).filename().string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto bytes = &file_bytes;
  ASSERT_EQ(bytes(dir_ + "/ck/iter_2/tokenizer.json"), bytes(tok));
  const std::string gen = " --prompt \"To be, or not\" --max-new-tokens 4 --json";
  const auto ids = &generated_ids;
  const Result told =
      run("generate --checkpoint " + dir_ + "/ck --set data.tokenizer=" + tok + gen);
  ASSERT_EQ(told.status, 0) << told.out;
  const Result own = run("generate --checkpoint " + dir_ + "/ck" + gen);
  ASSERT_EQ(own.status, 0) << own.out;
  EXPECT_EQ(ids(own), ids(told));

  r = run("export --checkpoint " + dir_ + "/ck --out " + dir_ + "/hf");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("tokenizer: " + dir_ + "/hf/tokenizer.json"), std::string::npos) << r.out;
  EXPECT_EQ(bytes(dir_ + "/hf/tokenizer.json"), bytes(tok));
  const Result hf = run("generate --hf " + dir_ + "/hf" + gen);
  ASSERT_EQ(hf.status, 0) << hf.out;
  EXPECT_EQ(ids(hf), ids(told));
  // eval --data: the run's text source through the run's tokenizer, from another folder.
  const std::string eval = " --data val --batches 2 --batch-size 2 --json";
  const Result eval_own = run_shell("cd / && " + std::string(STRATA_BIN_PATH) +
                                    " eval --checkpoint " + dir_ + "/ck" + eval + " 2>&1");
  ASSERT_EQ(eval_own.status, 0) << eval_own.out;
  const Result eval_told = run("eval --checkpoint " + dir_ + "/ck --config " + cfg + eval);
  ASSERT_EQ(eval_told.status, 0) << eval_told.out;
  EXPECT_EQ(eval_own.out.substr(eval_own.out.rfind("{\"")),
            eval_told.out.substr(eval_told.out.rfind("{\"")));

  // The copy is checksummed like every other file: a changed byte is named, not used.
  {
    std::fstream f(dir_ + "/ck/iter_2/tokenizer.json",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('~');
  }
  r = run("generate --checkpoint " + dir_ + "/ck/iter_2" + gen);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(error_line(r.out).find("iter_2/tokenizer.json: CRC-32"), std::string::npos) << r.out;
}

// A run that trained with a tiktoken file exports a tokenizer.json of the same ids (converted),
// which `generate --hf` reads; `strata data convert` writes the same file by hand. The fixture's
// 4352 ranks padded to GPT-2's 50256 (tokens that merge with nothing: 0xFF 0xFE and 4 bytes of
// their index) so that the file names its pattern as a real GPT-2 file does.
TEST_F(Cli, ATiktokenRunExportsATokenizerJsonOfTheSameIds) {
  const auto base64 = [](const std::string& in) {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < in.size(); i += 3) {
      uint32_t v = static_cast<unsigned char>(in[i]) << 16;
      if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
      if (i + 2 < in.size()) v |= static_cast<unsigned char>(in[i + 2]);
      out += k[(v >> 18) & 63];
      out += k[(v >> 12) & 63];
      out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
      out += i + 2 < in.size() ? k[v & 63] : '=';
    }
    return out;
  };
  std::string ranks =
      file_bytes(std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tiktoken");
  int n = static_cast<int>(std::count(ranks.begin(), ranks.end(), '\n'));
  ASSERT_EQ(n, 4352);
  for (; n < 50256; ++n) {
    const std::string token = {'\xFF',
                               '\xFE',
                               static_cast<char>(n >> 24),
                               static_cast<char>(n >> 16),
                               static_cast<char>(n >> 8),
                               static_cast<char>(n)};
    ranks += base64(token) + " " + std::to_string(n) + "\n";
  }
  const std::string tok = write("gpt2_padded.tiktoken", ranks);
  write_hamlet();
  const std::string cfg =
      config({{"model", {{"vocab_size", 50257}}},
              {"train", {{"iterations", 2}}},
              {"data", {{"source", "text"}, {"path", dir_ + "/corpus.txt"}, {"tokenizer", tok}}},
              {"checkpoint", {{"dir", dir_ + "/ck"}, {"interval", 2}}}});
  Result r = run("train --config " + cfg);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("export --checkpoint " + dir_ + "/ck --out " + dir_ + "/hf");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(
      r.out.find("tokenizer: " + dir_ + "/hf/tokenizer.json (the run's tiktoken file, converted)"),
      std::string::npos)
      << r.out;
  const std::string gen =
      " --prompt \"To be, or not<|endoftext|> whether\" --max-new-tokens 4 --json";
  const auto ids = &generated_ids;
  const Result own = run("generate --checkpoint " + dir_ + "/ck" + gen);
  ASSERT_EQ(own.status, 0) << own.out;
  const Result hf = run("generate --hf " + dir_ + "/hf" + gen);
  ASSERT_EQ(hf.status, 0) << hf.out;
  EXPECT_EQ(ids(hf), ids(own));
  EXPECT_NE(ids(own).find("50256"), std::string::npos) << ids(own);  // the special token

  // strata data convert writes the file export wrote.
  r = run("data convert --tokenizer " + tok + " --output " + dir_ + "/by_hand/tokenizer.json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(50257 tokens, 1 special;"), std::string::npos) << r.out;
  const auto bytes = &file_bytes;
  EXPECT_EQ(bytes(dir_ + "/by_hand/tokenizer.json"), bytes(dir_ + "/hf/tokenizer.json"));
  // Bad input: a tokenizer.json, an option of prepare's, no --output.
  for (const auto& [args, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--tokenizer " + dir_ + "/hf/tokenizer.json --output " + dir_ + "/x.json",
            "--tokenizer: a tiktoken ranks file (" + dir_ +
                "/hf/tokenizer.json is a tokenizer.json"},
           {"--tokenizer " + tok + " --input " + tok + " --output " + dir_ + "/x.json",
            "--input: an option of strata data convert"},
           {"--tokenizer " + tok, "--output: a tokenizer.json path"}}) {
    r = run("data convert " + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_NE(error_line(r.out).find(expected), std::string::npos) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.json"));
}

// data prepare ends with the vocabulary and the model.vocab_size a training config needs (a run
// of a smaller vocabulary fails on the first id past it).
TEST_F(Cli, DataPrepareNamesTheVocabularySizeToTrainWith) {
  const std::string tok =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  const std::string in = write("in.txt", "To be, or not to be.\n\nThat is the question.\n");
  // The output's folder is made when missing; under a file it cannot be, and that is bad input.
  Result r = run("data prepare --tokenizer " + tok + " --input " + in + " --output " + dir_ +
                 "/new/data/c");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/new/data/c.idx")) << r.out;
  const Result under_file =
      run("data prepare --tokenizer " + tok + " --input " + in + " --output " + in + "/c");
  EXPECT_EQ(under_file.status, 2) << under_file.out;
  EXPECT_NE(
      error_line(under_file.out).find("--output: a prefix whose folder exists or can be made"),
      std::string::npos)
      << under_file.out;
  const int vocab = strata::Tokenizer::load(tok)->vocab_size();
  EXPECT_NE(r.out.find("vocabulary " + std::to_string(vocab) + " ids: model.vocab_size at least " +
                       std::to_string(vocab) + " (" + std::to_string((vocab + 127) / 128 * 128)),
            std::string::npos)
      << r.out;
}

TEST(ClockTime, MinutesAndHours) {
  EXPECT_EQ(strata::clock_time(0), "0:00");
  EXPECT_EQ(strata::clock_time(59.6), "1:00");
  EXPECT_EQ(strata::clock_time(3599), "59:59");
  EXPECT_EQ(strata::clock_time(3600 + 62), "1:01:02");
  EXPECT_EQ(strata::clock_time(-1), "0:00");
}

// One rule for invalid UTF-8 wherever a tokenizer reads text: a text source with
// data.tokenizer reads it as U+FFFD, as strata data prepare does, and its description counts it
// (before: refused, while data prepare replaced it). Byte tokens still need valid UTF-8 (above).
TEST_F(Cli, TextThroughATokenizerReplacesInvalidUtf8AndCountsIt) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "word" + std::to_string(i % 50) + " ";
  text[1000] = static_cast<char>(0xFF);
  const std::string path = write("bad.txt", text);
  const std::string tok =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  const Result r = run("train --config " +
                       config({{"data", {{"source", "text"}, {"path", path}, {"tokenizer", tok}}},
                               {"model", {{"vocab_size", 4353}}}}) +
                       " --set train.iterations=1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1 invalid UTF-8 sequence(s) read as U+FFFD (the first at byte 1000)"),
            std::string::npos)
      << r.out;
}

// data prepare's new flags keep the bad-input contract: exit 2 and one line naming the flag.
TEST_F(Cli, DataPrepareBadTokenizerFlagsExitTwo) {
  const std::string dir = std::string(STRATA_TEST_DIR) + "/golden/tokenizer/";
  const std::string in = write("in.txt", "some text\n");
  const std::string common = " --input " + in + " --output " + dir_ + "/out";
  for (const auto& [flags, where] : std::vector<std::pair<std::string, std::string>>{
           {"--tokenizer " + dir + "gpt2_style.tokenizer.json --pattern gpt2",
            "<command line>: --pattern: "},
           {"--tokenizer " + dir + "gpt2_style.tiktoken --pattern gpt2 --special '<|x|>'",
            "<command line>: --special: "},
           {"--tokenizer " + dir + "gpt2_style.tiktoken", dir + "gpt2_style.tiktoken: "},
           {"--tokenizer " + dir + "gpt2_style.tiktoken --pattern '(unclosed'",
            dir + "gpt2_style.tiktoken: pattern: "}}) {
    const Result r = run("data prepare " + flags + common);
    EXPECT_EQ(r.status, 2) << flags << "\n" << r.out;
    EXPECT_NE(error_line(r.out).find(where), std::string::npos) << flags << "\n" << r.out;
  }
}

// data.tokenizer beside a tokenized dataset decodes its ids, so strata eval gives bits per byte
// on indexed data (before: the config was refused). Every id of the dataset is a one-byte token,
// so every target decodes to one byte and bits per byte is exactly loss / ln 2.
TEST_F(Cli, EvalGivesBitsPerByteOnIndexedDataThroughTheTokenizer) {
  const std::string tok_path =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  const std::unique_ptr<strata::Tokenizer> tok = strata::Tokenizer::load(tok_path);
  std::vector<int32_t> letters;
  for (char c = 'a'; c <= 'z'; ++c) letters.push_back(*tok->token_id(std::string(1, c)));
  const std::string prefix = dir_ + "/letters";
  strata::IndexedDatasetWriter w(prefix, 2);
  uint32_t x = 12345;
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> doc(100);
    for (int32_t& t : doc) t = letters[(x = x * 1103515245u + 12345u) >> 16 & 15];
    w.add_document(doc.data(), static_cast<int64_t>(doc.size()));
  }
  w.finish();
  const std::string ckpt = dir_ + "/ckpt";
  const std::string cfg =
      config({{"model", {{"vocab_size", 4353}}},
              {"train", {{"iterations", 2}}},
              {"data", {{"source", "indexed"}, {"path", prefix}, {"tokenizer", tok_path}}},
              {"checkpoint", {{"dir", ckpt}, {"interval", 2}}}});
  Result r = run("train --config " + cfg);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("eval --checkpoint " + ckpt + " --config " + cfg +
          " --data val --batches 2 --batch-size 2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.rfind("{\"")));
  ASSERT_TRUE(j["bits_per_byte"].is_number()) << r.out;
  EXPECT_NEAR(j["bits_per_byte"].get<double>(), j["loss"].get<double>() / std::log(2.0), 1e-9)
      << r.out;
}

TEST_F(Cli, DryRunPrintsSizesWithoutTraining) {
  Result r = run("train --config " + config() + " --dry-run");
  EXPECT_EQ(r.status, 0) << r.out;
  for (const char* k :
       {"parameters", "FLOPs per iteration", "gradients", "optimizer", "activations", "total"})
    EXPECT_NE(r.out.find(k), std::string::npos) << k << " missing in:\n" << r.out;
  EXPECT_EQ(r.out.find("iter "), std::string::npos) << "dry run must not train";
}

// The line of `out` that starts with `prefix` ("" when none).
std::string line_starting(const std::string& out, const std::string& prefix) {
  std::istringstream is(out);
  std::string line;
  while (std::getline(is, line))
    if (line.rfind(prefix, 0) == 0) return line;
  return "";
}

// The text between `before` and the next `after` in `s` ("" when absent).
std::string between(const std::string& s, const std::string& before, const std::string& after) {
  const size_t a = s.find(before);
  if (a == std::string::npos) return "";
  const size_t b = s.find(after, a + before.size());
  return b == std::string::npos ? "" : s.substr(a + before.size(), b - a - before.size());
}

// issue 40: llama-3.1-8b on 64 GPUs predicted from one process (the model would not fit this
// machine), in words, with the faster layout strata plan finds; both figures are strata plan's.
TEST_F(Cli, DryRunPredictsAnyWorldFromOneProcess) {
  const std::string cfg = config({{"model", {{"preset", "llama-3.1-8b"}}},
                                  {"device", "cuda"},
                                  {"parallel", {{"tensor", 8}}},
                                  {"train",
                                   {{"global_batch_size", 64},
                                    {"micro_batch_size", 1},
                                    {"precision", "bf16"},
                                    {"recompute", "none"}}}});
  const Result r = run("train --config " + cfg + " --dry-run --world 64");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parallel: tensor 8 × pipeline 1 × data 8 = 64 ranks"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("predicted on dgx-h100 (a cuda config's default; --cluster to choose): 8 "
                       "nodes × 8 GPUs, bf16, Strata's CUDA runtime"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("{"), std::string::npos) << "words, not JSON:\n" << r.out;
  EXPECT_EQ(r.out.find("rank   tp"), std::string::npos) << "no rank table for --world\n" << r.out;
  const std::string memory = line_starting(r.out, "  memory: peak ");
  EXPECT_NE(memory.find(" of 80 GiB: fits"), std::string::npos) << r.out;
  // The config's own figure is strata plan's for the same layout pinned.
  const std::string mine = between(r.out, "\n  iteration ", ":");
  ASSERT_FALSE(mine.empty()) << r.out;
  const Result pinned = run("plan --model " + cfg +
                            " --cluster dgx-h100 --nodes 8 --fix tensor=8,pipeline=1,data=8,"
                            "context=1,micro_batch_size=1,recompute=none,sequence_parallel=false,"
                            "distributed_optimizer=false");
  ASSERT_EQ(pinned.status, 0) << pinned.out;
  EXPECT_NE(line_starting(pinned.out, "1 ").find(" " + mine + " "), std::string::npos)
      << mine << " in\n"
      << pinned.out;
  // The faster layout is strata plan's best, and the ratio is the two times'.
  const std::string faster = line_starting(r.out, "strata plan finds a faster layout that fits: ");
  ASSERT_FALSE(faster.empty()) << r.out;
  const std::string best = between(faster, "distributed optimizer: ", " per iteration");
  const Result plan = run("plan --model " + cfg + " --cluster dgx-h100 --nodes 8");
  ASSERT_EQ(plan.status, 0) << plan.out;
  EXPECT_NE(line_starting(plan.out, "1 ").find(" " + best + " "), std::string::npos)
      << best << " in\n"
      << plan.out;
  const double speedup = std::stod(between(faster, "MFU ", "× faster")
                                       .substr(between(faster, "MFU ", "× faster").find(", ") + 2));
  EXPECT_NEAR(speedup, std::stod(mine) / std::stod(best), 0.01 * speedup) << faster;
  EXPECT_NE(r.out.find("(strata plan --model " + cfg + " --cluster dgx-h100 --nodes 8 lists them)"),
            std::string::npos)
      << r.out;
}

TEST_F(Cli, DryRunWorldSaysWhatDoesNotFit) {
  // 8B in fp32 with Adam on 8 CPU ranks of this machine: far over; nothing else fits either.
  const std::string cfg = config({{"model", {{"preset", "llama-3.1-8b"}}},
                                  {"parallel", {{"tensor", 8}}},
                                  {"train", {{"global_batch_size", 8}, {"micro_batch_size", 1}}}});
  Result r = run("train --config " + cfg + " --dry-run --world 8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("predicted on this machine, shared by the 8 ranks: 1 node × 8 ranks, fp32, "
                       "the CPU runtime"),
            std::string::npos)
      << r.out;
  EXPECT_NE(line_starting(r.out, "  memory: peak ").find(": does NOT fit ("), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("strata plan finds no layout of these 8 ranks that fits"), std::string::npos)
      << r.out;
  // On 8 H100 nodes it fits, as strata plan says, with a CPU config run on the GPUs.
  r = run("train --config " + cfg + " --dry-run --world 64 --cluster dgx-h100");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Strata's CUDA runtime"), std::string::npos) << r.out;
  // Without --world the same config is a layout for 8 ranks: the error says how to see it.
  r = run("train --config " + cfg + " --dry-run");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(error_line(r.out),
            "error: " + cfg +
                ": parallel: world size 1 (mpirun -np) is not divisible by tensor 8 × pipeline 1 "
                "= 8 (strata train --dry-run --world N predicts for N ranks from one process)")
      << r.out;
  // A world the layout does not divide is blamed on --world; whole nodes only.
  r = run("train --config " + cfg + " --dry-run --world 12");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(error_line(r.out).find("world size 12 (--world) is not divisible"), std::string::npos)
      << r.out;
  r = run("train --config " + cfg +
          " --dry-run --world 12 --cluster dgx-h100 --set parallel.tensor=4 --set "
          "train.global_batch_size=24");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(error_line(r.out),
            "error: <command line>: --world: whole nodes of dgx-h100 (8 ranks each) or at most "
            "one, got 12 ranks")
      << r.out;
  for (const std::string& bad : {std::string("--world 8"), std::string("--cluster dgx-h100")}) {
    r = run("train --config " + cfg + " " + bad);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(error_line(r.out).find("--dry-run with it"), std::string::npos) << r.out;
  }
  r = run("train --config " + cfg + " --dry-run --world 0");
  EXPECT_EQ(error_line(r.out),
            "error: <command line>: --world: a rank count from 1 to 1048576, got '0'")
      << r.out;
}

// A model this machine cannot hold: the dry run says that training would stop, and still prints.
TEST_F(Cli, DryRunSaysTrainingWouldNotFitThisMachine) {
  const Result r = run("train --config " +
                       config({{"model", {{"preset", "llama-3.1-8b"}}},
                               {"train", {{"global_batch_size", 1}, {"micro_batch_size", 1}}}}) +
                       " --dry-run");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("memory: training here would stop (exit 2), it needs a model that fits in "
                       "this machine's memory: training needs "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank   tp"), std::string::npos) << r.out;
}

// issue 39 item 16: an allocation that fails names its operation, as bad input (exit 2, one
// line naming the file and key) where the input's sizes drove it, else as a failure (exit 1).
// STRATA_TEST_OUT_OF_MEMORY fails the named operation's allocation (runtime/base/operation.h).
TEST_F(Cli, OutOfMemoryNamesTheOperation) {
  const std::string cfg = config();
  const std::string tok =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  const std::string input = write("in.txt", "some text to tokenize\n");
  const std::string hf = std::string(STRATA_TEST_DIR) + "/golden/generate/hf_gpt2_tiny";
  const std::string prepare =
      "data prepare --tokenizer " + tok + " --input " + input + " --output " + dir_ + "/out";
  struct Case {
    std::string operation, args;
    int status;
    std::string line;  // the error line's start
  };
  for (const Case& c : std::vector<Case>{
           {"building the model", "train --config " + cfg, 2,
            "error: " + cfg +
                ": model: sizes that this process's memory holds: building the model, its "
                "gradients and optimizer state ran out of host memory ("},
           {"opening the data", "train --config " + cfg, 2,
            "error: " + cfg + ": data: sizes that this process's memory holds: opening the data"},
           {"training iteration 2", "train --config " + cfg, 1,
            "error: out of host memory while training iteration 2 ("},
           {"loading the tokenizer", prepare, 2,
            "error: " + tok + ": sizes that this process's memory holds: loading the tokenizer"},
           {"reading and tokenizing", prepare, 2,
            "error: " + input +
                ": sizes that this process's memory holds: reading and tokenizing " + input +
                " ran out of host memory"},
           {"searching layouts", "plan --model tiny --cluster dgx-h100 --global-batch-size 8", 1,
            "error: out of host memory while searching layouts ("},
           {"building the model and loading its weights",
            "generate --hf " + hf + " --prompt-ids 1,2 --max-new-tokens 2", 2,
            "error: " + hf +
                ": sizes that this process's memory holds: building the "
                "model and loading its weights"}}) {
    SCOPED_TRACE(c.operation);
    const Result r = run(c.args, "STRATA_TEST_OUT_OF_MEMORY='" + c.operation + "'");
    EXPECT_EQ(r.status, c.status) << r.out;
    // Exit 1 is a failure line with the rank and host before "error: ".
    const size_t at = r.out.find(c.line);
    EXPECT_NE(at, std::string::npos) << r.out;
    // The limit that applied: the machine's, a cgroup's (a CI container's) or ulimit -v.
    EXPECT_TRUE(std::regex_search(
        r.out.substr(at == std::string::npos ? 0 : at),
        std::regex(
            R"(ran out of host memory \((this machine has|cgroup memory\.max|ulimit -v) [0-9.]+ GiB\))"
            "|"
            R"(out of host memory while [^\n]* \((this machine has|cgroup memory\.max|ulimit -v) [0-9.]+ GiB\))")))
        << r.out;
    if (c.status == 2) {
      EXPECT_EQ(error_line(r.out).rfind(c.line, 0), 0u) << r.out;
    }
  }
  // Without the hook the same commands succeed (the hook, not the commands, failed them).
  EXPECT_EQ(run("train --config " + cfg).status, 0);
  EXPECT_EQ(run(prepare).status, 0);
}

// A process limited below the machine (ulimit -v, as some schedulers set): the start-up check
// compares a rank's predicted peak with its address space and refuses before allocating.
TEST_F(Cli, TrainRefusesAModelOverTheAddressSpaceLimit) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers reserve terabytes of address space: ulimit -v cannot apply";
#else
  const std::string cfg =
      config({{"model", {{"preset", "gpt2-124m"}}}, {"train", {{"micro_batch_size", 1}}}});
  const Result r = run_shell("sh -c 'ulimit -v 3000000 && exec " + std::string(STRATA_BIN_PATH) +
                             " train --config " + cfg + "' 2>&1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(error_line(r.out).rfind("error: " + cfg +
                                        ": model: a model that fits in this process's address "
                                        "space: a rank needs ",
                                    0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find(", ulimit -v allows 2.86 GiB"), std::string::npos) << r.out;
#endif
}

TEST_F(Cli, TrainsAndWritesMetricsWithDesignKeys) {
  const std::string metrics = dir_ + "/metrics.jsonl";
  Result r = run("train --config " + config() + " --set log.metrics=" + metrics +
                 " --set train.eval_interval=3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("done: 3 iterations"), std::string::npos) << r.out;
  std::ifstream in(metrics);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(j["iter"], n);
    for (const char* k : {"loss", "lr", "grad_norm", "step_ms", "tokens_per_s", "tflops_per_gpu",
                          "mfu", "bubble", "mem_peak_bytes"})
      EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
    EXPECT_GT(j["loss"].get<double>(), 0.0);
    EXPECT_GT(j["mem_peak_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(j.contains("val_loss"), n == 3) << line;
  }
  EXPECT_EQ(n, 3);
}

TEST_F(Cli, UnwritableMetricsPathExitsTwo) {
  Result r = run("train --config " + config() + " --set log.metrics=/nonexistent/dir/m.jsonl");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(error_line(r.out).find("log.metrics"), std::string::npos);
}

// A log that cannot be written (a full disk) is a warning at its first failure, and the run, which
// trains to the end, exits with status 3 naming the incomplete logs (it exited 0 with empty files
// and no word).
TEST_F(Cli, LogsOnAFullDiskAreReportedWithExitStatus3) {
  for (const char* key : {"log.metrics", "log.trace"}) {
    Result r = run("train --config " + config() + " --set " + key + "=/dev/full");
    EXPECT_EQ(r.status, 3) << r.out;
    EXPECT_NE(r.out.find("done: 3 iterations"), std::string::npos) << r.out;
    const std::string warning = std::string("warning: ") + key + ": cannot write /dev/full (";
    EXPECT_NE(r.out.find(warning), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(warning), r.out.rfind(warning)) << "one warning per log:\n" << r.out;
    EXPECT_NE(r.out.find("No space left on device; the log is incomplete"), std::string::npos)
        << r.out;
    EXPECT_NE(
        r.out.find(std::string("the logs are incomplete (") + key + " /dev/full): exit status 3"),
        std::string::npos)
        << r.out;
  }
  // A disk that fills during the run: the lines before are kept, the warning names the
  // iteration whose line did not fit.
  strata::testdisk::SmallDisk disk("8k");
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  const std::string metrics = disk.path() + "/m.jsonl";
  Result r = run("train --config " + config() + " --set log.metrics=" + metrics +
                 " --set train.iterations=60");
  EXPECT_EQ(r.status, 3) << r.out;
  std::ifstream in(metrics);
  std::string line;
  int complete = 0;
  while (std::getline(in, line) && !in.eof()) {
    EXPECT_EQ(nlohmann::json::parse(line)["iter"], ++complete) << line;
  }
  EXPECT_GT(complete, 0);
  EXPECT_LT(complete, 60);
  EXPECT_NE(r.out.find("warning: log.metrics: cannot write " + metrics + " (iteration " +
                       std::to_string(complete + 1) + "): No space left on device"),
            std::string::npos)
      << "complete lines: " << complete << "\n"
      << r.out;
}

// strata export to a Hugging Face directory, sharded, and model.init_from reading it back; a bad
// size and a missing shard are one error line each (exit 2) naming the flag, or the file and the
// tensor.
TEST_F(Cli, ExportsAShardedDirectoryThatInitFromReads) {
  const std::string ckpt = dir_ + "/ckpt", hf = dir_ + "/hf";
  Result r = run("train --config " + config({{"checkpoint", {{"dir", ckpt}, {"interval", 3}}}}));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("export --checkpoint " + ckpt + " --out " + hf + " --max-shard-size 40KB");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("exported " + ckpt + "/iter_3 to " + hf), std::string::npos) << r.out;
  std::ifstream in(hf + "/model.safetensors.index.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json index = nlohmann::json::parse(in);
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  EXPECT_GE(shards.size(), 2u);
  for (const std::string& s : shards) EXPECT_EQ(s.rfind("model-0000", 0), 0u) << s;

  r = run("train --config " + config() + " --set model.init_from=" + hf +
          " --set train.iterations=1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("initialised from " + hf), std::string::npos) << r.out;

  r = run("export --checkpoint " + ckpt + " --out " + hf + " --max-shard-size 5XB");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(error_line(r.out).find("--max-shard-size"), std::string::npos) << r.out;

  const std::string shard = *shards.begin();
  std::remove((hf + "/" + shard).c_str());
  r = run("train --config " + config() + " --set model.init_from=" + hf +
          " --set train.iterations=1");
  EXPECT_EQ(r.status, 2) << r.out;
  const std::string line = error_line(r.out);
  EXPECT_EQ(line.rfind("error: " + hf + "/" + shard + ": tensor transformer.", 0), 0u) << line;
}

// strata generate from a checkpoint: the training config itself is accepted, while a config or
// --set naming another shape is one error line (exit 2) naming the checkpoint's run_state.json
// and each differing key with both values, not a silent choice of one of the two models.
TEST_F(Cli, GenerateRefusesACheckpointOfAnotherShape) {
  const std::string ckpt = dir_ + "/ckpt";
  const std::string cfg = config({{"checkpoint", {{"dir", ckpt}, {"interval", 3}}}});
  Result r = run("train --config " + cfg);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string gen = "generate --checkpoint " + ckpt + " --prompt-ids 1,2 --max-new-tokens 3";
  r = run(gen + " --config " + cfg);
  EXPECT_EQ(r.status, 0) << r.out;
  r = run(gen + " --set model.num_layers=3");
  EXPECT_EQ(r.status, 2) << r.out;
  std::string line = error_line(r.out);
  EXPECT_NE(line.find(ckpt + "/iter_3/run_state.json: model:"), std::string::npos) << line;
  EXPECT_NE(line.find("num_layers (run_state.json 2, --set 3)"), std::string::npos) << line;
  r = run(gen + " --config " + config({{"model", {{"hidden_size", 96}}}}));
  EXPECT_EQ(r.status, 2) << r.out;
  line = error_line(r.out);
  EXPECT_NE(line.find("hidden_size (run_state.json 64, "), std::string::npos) << line;
}

}  // namespace
