// test_bad_input.cc — the cases of issue 28's audit, on the strata binary: each bad input ends
// with status 2 and one line naming the file, the key or offset and what was expected, quickly;
// none crashes, hangs, or runs the job before failing. The fuzzer (test_fuzz_inputs.cc) checks
// the same contract on inputs it makes up.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// Case 3: a key holding \u0000 cut the message at the NUL.
TEST_F(BadInput, ControlBytesAreEscaped) {
  const std::string path = write("nul.json", R"({"model": {"a\u0000b": 1}})");
  refused({"train", "--config", path, "--dry-run"}, "error: " + path + ": model.a\\x00b: ",
          {"unknown key (known keys of model: preset"});
}


}  // namespace
}  // namespace strata
