// test_bad_input.cc — the cases of issue 28's audit, on the strata binary: each bad input ends
// with status 2 and one line naming the file, the key or offset and what was expected, quickly;
// none crashes, hangs, or runs the job before failing. The fuzzer (test_fuzz_inputs.cc) checks
// the same contract on inputs it makes up.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/subprocess.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::Outcome;
using testing::run_strata;

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(::testing::TempDir()) / (std::string("strata_bad_input_") + info->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // A tiny config that trains in well under a second; `extra` is merged over it.
  std::string config(const json& extra = json::object(), const std::string& name = "c.json") {
    json j = {{"model", {{"preset", "tiny"}}},
              {"train",
               {{"micro_batch_size", 2},
                {"global_batch_size", 4},
                {"iterations", 3},
                {"eval_interval", 0}}}};
    j.merge_patch(extra);
    return write(name, j.dump());
  }
  // Runs strata and expects status 2 with its one line starting with `prefix` and holding each
  // of `words`; returns the outcome.
  static Outcome refused(const std::vector<std::string>& args, const std::string& prefix,
                         const std::vector<std::string>& words = {}, double timeout_s = 20) {
    const Outcome o = run_strata(args, timeout_s);
    EXPECT_EQ(testing::contract_violation(o), "") << o.err;
    EXPECT_EQ(o.status, 2) << o.out << o.err;
    EXPECT_EQ(o.err.rfind(prefix, 0), 0u) << o.err;
    for (const std::string& w : words) EXPECT_NE(o.err.find(w), std::string::npos) << o.err;
    return o;
  }

  std::string dir_;
};

// Case 1: 70,000 levels overflowed the stack (json::dump in the error message); 50,000 nested
// objects took 17 s to refuse.
TEST_F(BadInput, DeepNestingIsRefusedAtOnce) {
  const int depth = 200000;
  const std::string arrays =
      write("arrays.json", std::string(depth, '[') + std::string(depth, ']'));
  std::string text = "{\"model\": ";
  for (int i = 0; i < 50000; ++i) text += "{\"a\": ";
  text += "1" + std::string(50001, '}');
  const std::string objects = write("objects.json", text);
  for (const std::string& path : {arrays, objects}) {
    const Outcome o = refused({"train", "--config", path, "--dry-run"}, "error: " + path + ": ",
                              {"nested at most 64 deep"});
    EXPECT_LT(o.seconds, 5.0);
  }
}

// Case 2: a number beyond double's range exited 1 with nlohmann's out_of_range.406 text.
TEST_F(BadInput, NumberBeyondDoubleExitsTwo) {
  const std::string path =
      write("lr.json", R"({"model": {"preset": "tiny"}, "optimizer": {"lr": 1e999}})");
  refused({"train", "--config", path, "--dry-run"},
          "error: " + path + ": optimizer.lr: ", {"got 1e999"});
  refused({"train", "--config", config(), "--set", "optimizer.lr=1e999", "--dry-run"},
          "error: <command line>: optimizer.lr: ", {"got 1e999"});
}

// Case 3: a key holding \u0000 cut the message at the NUL.
TEST_F(BadInput, ControlBytesAreEscaped) {
  const std::string path = write("nul.json", R"({"model": {"a\u0000b": 1}})");
  refused({"train", "--config", path, "--dry-run"},
          "error: " + path + ": model.a\\x00b: ", {"unknown key (known keys of model: preset"});
}

// Case 4: /dev/zero read until memory ran out, a FIFO blocked forever, /proc/self/status as
// text data exited 1 ("cannot create std::vector larger than max_size()"). Every input must be
// a regular file of a sane size.
TEST_F(BadInput, InputsMustBeRegularFiles) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo, dir_}) {
    refused({"train", "--config", path, "--dry-run"},
            "error: " + path + ": expected a regular file");
  }
  refused({"train", "--config", config(), "--plan", fifo}, "error: " + fifo + ": ",
          {"expected a regular file, got a FIFO"});
  // Not a file, so taken for a preset name.
  refused({"train", "--config", config(), "--dry-run", "--cluster", fifo},
          "error: <command line>: --cluster: ", {"a cluster file or preset"});
  refused({"plan", "--model", "tiny", "--cluster", "cpu-local", "--precision", "fp32",
           "--global-batch-size", "4", "--profile", fifo},
          "error: " + fifo + ": ", {"expected a regular file, got a FIFO"});

  // Files a config names: the data, the tokenizer, the weights to start from.
  const json bytes = {{"vocab_size", 256}};
  refused(
      {"train", "--config",
       config({{"data", {{"source", "text"}, {"path", "/proc/self/status"}}}, {"model", bytes}})},
      "error: /proc/self/status: byte 0: ", {"a /proc or /sys file"});
  refused({"train", "--config",
           config({{"data", {{"source", "text"}, {"path", fifo}}}, {"model", bytes}})},
          "error: " + dir_ + "/c.json: data.path: ", {"a regular file"});
  const std::string text = write("text.txt", std::string(20000, 'a'));
  refused({"train", "--config",
           config({{"data", {{"source", "text"}, {"path", text}, {"tokenizer", fifo}}},
                   {"model", bytes}})},
          "error: " + fifo + ": ", {"expected a regular file, got a FIFO"});
  refused({"train", "--config", config({{"model", {{"init_from", fifo}}}})},
          "error: " + fifo + ": ", {"expected a regular file, got a FIFO"});

  // strata data prepare's tokenizer and inputs.
  refused({"data", "prepare", "--tokenizer", fifo, "--input", text, "--output", dir_ + "/out"},
          "error: " + fifo + ": ", {"expected a regular file, got a FIFO"});
  const std::string tok =
      std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";
  refused({"data", "prepare", "--tokenizer", tok, "--input", text, "--input", fifo, "--output",
           dir_ + "/out"},
          "error: " + fifo + ": ", {"expected a regular file, got a FIFO"});
  EXPECT_FALSE(fs::exists(dir_ + "/out.idx"));  // checked before anything is written

  // A Hugging Face directory whose config.json is a FIFO.
  fs::create_directories(dir_ + "/hf");
  ASSERT_EQ(::mkfifo((dir_ + "/hf/config.json").c_str(), 0600), 0);
  refused({"generate", "--hf", dir_ + "/hf", "--prompt-ids", "1,2"},
          "error: " + dir_ + "/hf/config.json: ", {"expected a regular file, got a FIFO"});
}

// Case 5: huge --stages / --microbatches / --chunks ended in std::bad_alloc.
TEST_F(BadInput, ScheduleSizesAreBounded) {
  const std::vector<std::vector<std::string>> cases = {
      {"--schedule", "1f1b", "--stages", "100000000", "--microbatches", "1"},
      {"--schedule", "interleaved", "--stages", "8", "--microbatches", "1000000", "--chunks", "2"},
      {"--schedule", "interleaved", "--stages", "8", "--microbatches", "8", "--chunks",
       "100000000"},
      {"--schedule", "2bw", "--stages", "4", "--microbatches", "4", "--batches", "100000000"}};
  for (std::vector<std::string> args : cases) {
    args.insert(args.begin(), "schedule");
    const Outcome o =
        refused(args, "error: <command line>: --",
                {"stages × (chunks × microbatches × batches + stages) at most 524288"});
    EXPECT_LT(o.seconds, 5.0);
  }
  EXPECT_EQ(
      run_strata({"schedule", "--schedule", "1f1b", "--stages", "512", "--microbatches", "512"}, 60)
          .status,
      0);
}

// Case 6: a checkpoint.dir naming a file, a log.trace or log.metrics naming a directory or an
// unwritable path were found after training (log.trace: the whole run, then status 2 and no
// "done" line). Every output is checked before the first step.
TEST_F(BadInput, OutputPathsAreCheckedBeforeTraining) {
  const std::string file = write("a_file", "x");
  const std::string missing_dir = dir_ + "/no/such/dir/out.json";
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"checkpoint", {{"dir", file}, {"interval", 1}}}}, "checkpoint.dir"},
      {{{"checkpoint", {{"dir", file}}}}, "checkpoint.dir"},
      {{{"log", {{"trace", dir_}}}}, "log.trace"},
      {{{"log", {{"metrics", dir_}}}}, "log.metrics"},
      {{{"log", {{"trace", missing_dir}}}}, "log.trace"},
      {{{"log", {{"metrics", missing_dir}}}}, "log.metrics"},
      {{{"log", {{"trace", "/proc/strata-trace.json"}}}}, "log.trace"},
      // An existing /proc file opens for writing but takes no log (the fuzzer's case 20, seed
      // 28: it trained, then exited 3).
      {{{"log", {{"metrics", "/proc/self/status"}}}}, "log.metrics"},
  };
  for (const auto& [extra, key] : cases) {
    const Outcome o = refused({"train", "--config", config(extra)},
                              "error: " + dir_ + "/c.json: " + key + ": ", {"expected a"});
    EXPECT_EQ(o.out.find("iter "), std::string::npos) << "trained before failing:\n" << o.out;
  }
  EXPECT_EQ(std::ifstream(file).rdbuf()->sgetc(), 'x');  // nothing lost

  // What is fine: existing files are kept until written, missing directories made, and a
  // character device is a sink.
  EXPECT_EQ(
      run_strata({"train", "--config", config({{"log", {{"metrics", "/dev/null"}}}})}, 60).status,
      0);
  const std::string metrics = write("m.jsonl", "");
  const Outcome ok =
      run_strata({"train", "--config",
                  config({{"checkpoint", {{"dir", dir_ + "/new/ckpt"}, {"interval", 3}}},
                          {"log", {{"metrics", metrics}, {"trace", dir_ + "/t.json"}}}})},
                 60);
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(fs::is_directory(dir_ + "/new/ckpt/iter_3"));
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/t.json"));
}

// Case 7: `train --plan` applied a plan made for another model or batch: layers_per_stage
// summing to 5 trained 5 layers of a 4-layer model (exit 0), and a plan for 4 layers trained 4
// of a config of 8 whose checkpoint then could not be resumed or exported.
TEST_F(BadInput, PlanMustMatchTheConfig) {
  const std::string cfg =
      config({{"model", {{"num_layers", 4}}}, {"train", {{"global_batch_size", 8}}}});
  const std::string plan_path = dir_ + "/plan.json";
  const Outcome planned =
      run_strata({"plan", "--model", cfg, "--cluster", "cpu-local", "--nodes", "2", "--precision",
                  "fp32", "--global-batch-size", "8", "--fix",
                  "tensor=1,pipeline=2,virtual_stages=1,schedule=1f1b,micro_batch_size=2", "--json",
                  plan_path},
                 60);
  ASSERT_EQ(planned.status, 0) << planned.err;
  json plan = json::parse(std::ifstream(plan_path));
  plan["plans"][0]["layers_per_stage"] = {{3}, {2}};
  const std::string five = write("five.json", plan.dump());
  refused({"train", "--config", cfg, "--plan", five},
          "error: " + five + ": plans[0].layers_per_stage: ",
          {"the config's model.num_layers 4", "got 5"});
  refused(
      {"train", "--config", cfg, "--plan", plan_path, "--set", "model.num_layers=8"},
      "error: " + plan_path + ": model.num_layers: ", {"the config's model.num_layers 8", "got 4"});
  refused({"train", "--config", cfg, "--plan", plan_path, "--set", "train.global_batch_size=16"},
          "error: " + plan_path + ": global_batch_size: ", {"train.global_batch_size 16", "got 8"});
}

// What the fuzzer (test_fuzz_inputs.cc) found, each kept here as it was found.
TEST_F(BadInput, FuzzerFinds) {
  // A path too long for the system: std::filesystem threw (exit 1).
  const std::string long_name = std::string(5000, 'x');
  // (Relative, it counts from the config's folder: dir_.)
  refused({"train", "--config", config({{"model", {{"init_from", long_name}}}})},
          "error: " + (dir_ + "/" + long_name).substr(0, 900), {"File name too long"});
  // A FIFO as --trace: the command blocked opening it.
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused(
      {"schedule", "--schedule", "zb-h1", "--stages", "3", "--microbatches", "6", "--trace", fifo},
      "error: <command line>: --trace: ", {"a FIFO"});
  refused({"plan", "--model", "tiny", "--cluster", "cpu-local", "--precision", "fp32",
           "--global-batch-size", "4", "--json", fifo},
          "error: <command line>: --json: ", {"a FIFO"});
  // vocab_size 2^31 - 1: padded to a multiple of 128 it overflowed int (a failed check, exit 1).
  refused({"train", "--config", config(), "--set", "model.vocab_size=2147483647", "--dry-run"},
          "error: <command line>: model.vocab_size: ", {"at most 2^30"});
  // A tokenizer id of 2^30 made a 2^30-entry table (std::bad_alloc, exit 1).
  json tok = json::parse(
      std::ifstream(std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json"));
  tok["model"]["vocab"]["!"] = 1 << 30;
  const std::string tok_path = write("tokenizer.json", tok.dump());
  refused({"data", "prepare", "--tokenizer", tok_path, "--input", write("in.txt", "text"),
           "--output", dir_ + "/out"},
          "error: " + tok_path + ": model.vocab.!: ", {"up to 4194303"});
  // A Hugging Face config.json of the wrong types: nlohmann's type_error (exit 1).
  const std::string hf = std::string(STRATA_TEST_DIR) + "/golden/generate/hf_gpt2_tiny";
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"n_embd", "64"}, {"tie_word_embeddings", 1}, {"n_head", 0}, {"model_type", 2}}) {
    fs::create_directories(dir_ + "/hf");
    json cfg = json::parse(std::ifstream(hf + "/config.json"));
    cfg[key] = value;
    std::ofstream(dir_ + "/hf/config.json") << cfg.dump();
    fs::copy_file(hf + "/model.safetensors", dir_ + "/hf/model.safetensors",
                  fs::copy_options::overwrite_existing);
    refused({"generate", "--hf", dir_ + "/hf", "--prompt-ids", "1,2"},
            "error: " + dir_ + "/hf/config.json: " + key + ": ");
  }
}

// Fuzzer seed 11: a task line nested thousands deep crashed eval (SIGSEGV, cases 969 and 2124);
// a config of 16.7 M layers hung the dry run (cases 2241 and 3397: a layout of every layer to
// count the parameters).
TEST_F(BadInput, FuzzerSeed11Finds) {
  const std::string hf = std::string(STRATA_TEST_DIR) + "/golden/generate/hf_gpt2_tiny";
  // Valid JSON nested 100k deep (the parser's DOM was then destroyed recursively).
  const std::string deep = "{\"ctx_ids\": [1, 2], \"endings_ids\": [[3], " +
                           std::string(100000, '[') + std::string(100000, ']') + "], \"label\": 0}";
  const std::string task =
      write("task.jsonl",
            "{\"ctx_ids\": [1, 2], \"endings_ids\": [[3], [4]], \"label\": 0}\n" + deep + "\n");
  refused({"eval", "--hf", hf, "--task", task}, "error: " + task + ": line 2: endings_ids[1]",
          {"nested at most 64 deep"});
  const Outcome o = run_strata(
      {"train", "--config", config(), "--set", "model.num_layers=16777217", "--dry-run"}, 60);
  EXPECT_EQ(testing::contract_violation(o), "") << o.err;
  EXPECT_EQ(o.status, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("memory: training here would stop (exit 2)"), std::string::npos) << o.out;
}

}  // namespace
}  // namespace strata
