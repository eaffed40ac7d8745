// The strata command as a user meets it: exit statuses, the one-line error format of
// docs/contracts.md for bad configs and bad data files, --help, --version, --dry-run and the
// metrics file. Runs the real binary (STRATA_BIN_PATH) in a subprocess.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "launch/train/reporting.h"
#include "runtime/data/indexed.h"
#include "runtime/data/tokenizer.h"
#include "small_disk.h"

namespace {

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

// env: "NAME=VALUE" assignments the command runs with.
Result run(const std::string& args, const std::string& env = "") {
  const std::string cmd =
      (env.empty() ? "" : "env " + env + " ") + std::string(STRATA_BIN_PATH) + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
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

// Neither a Hugging Face directory nor a checkpoint records the data: `eval --data` needs it
// named, rather than evaluating the built-in synthetic chain without a word.
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
  Result trained = run("train --config " + config() + " --set checkpoint.dir=" + dir_ + "/ck");
  ASSERT_EQ(trained.status, 0) << trained.out;
  Result checkpoint = run("eval --checkpoint " + dir_ + "/ck --data val --batches 1");
  EXPECT_EQ(checkpoint.status, 2) << checkpoint.out;
  EXPECT_NE(error_line(checkpoint.out).find("--data"), std::string::npos) << checkpoint.out;
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

// data prepare ends with the vocabulary and the model.vocab_size a training config needs (a run
// of a smaller vocabulary fails on the first id past it).
TEST_F(Cli, DataPrepareNamesTheVocabularySizeToTrainWith) {
  const std::string tok =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  const std::string in = write("in.txt", "To be, or not to be.\n\nThat is the question.\n");
  Result r = run("data prepare --tokenizer " + tok + " --input " + in + " --output " + dir_ + "/c");
  ASSERT_EQ(r.status, 0) << r.out;
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
