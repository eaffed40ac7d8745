// Tokenized datasets end to end (data.source "indexed" / "tokens", data.blend, strata data
// prepare): datasets written with Strata's writers into a temporary directory, read through the
// config like a user's.
//
//   * every layout sees the same global batches: the sequences of a global batch are the same
//     whether one rank draws them all or ranks draw slices of it;
//   * resume: a run stopped at a checkpoint mid-epoch and resumed sees the samples of the
//     uninterrupted run — its losses are bit-identical — with a blend of two datasets;
//   * bad data: a blend path that does not exist, a token at or beyond the model's vocabulary;
//   * strata data prepare: JSON Lines and paragraphs of text through the golden GPT-2-style
//     tokenizer into an indexed dataset and into llm.c shards, tokens equal to the tokenizer's
//     ids of each document plus the end-of-document token (after it for Megatron, before it for
//     llm.c); special tokens written in a document are text unless --allow-special; a tiktoken
//     file of any rank count with --pattern and --special (Whisper's empty last rank); invalid
//     UTF-8 read as U+FFFD and counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "launch/commands/data.h"
#include "launch/config/config_parse.h"
#include "launch/train/trainer.h"
#include "runtime/base/error.h"
#include "runtime/data/data_source.h"
#include "runtime/data/indexed.h"
#include "runtime/data/token_shards.h"
#include "runtime/data/tokenizer.h"
#include "tests/tokenizer_fixtures.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const std::string kTokenizer =
    std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tokenizer.json";

class Datasets : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_datasets_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An indexed dataset of `docs` documents of random length in [20, 200) and tokens in
  // [0, vocab), from `seed`.
  std::string indexed(const std::string& name, int docs, int vocab, uint32_t seed) {
    const std::string prefix = (dir_ / name).string();
    IndexedDatasetWriter w(prefix, 2);
    std::mt19937 rng(seed);
    for (int d = 0; d < docs; ++d) {
      std::vector<int32_t> t(20 + rng() % 180);
      for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
      w.add_document(t.data(), static_cast<int64_t>(t.size()));
    }
    w.finish();
    return prefix;
  }

  std::vector<std::string> train_sets(const std::string& blend) {
    return {"model.preset=tiny",     "model.num_layers=2",       "model.seq_len=32",
            "train.iterations=8",    "train.micro_batch_size=2", "train.global_batch_size=4",
            "train.eval_interval=4", "train.eval_iters=2",       "train.threads=1",
            "log.interval=1000",     "data.source=indexed",      "data.blend=" + blend};
  }

  fs::path dir_;
};

TEST_F(Datasets, EveryLayoutDrawsTheSameGlobalBatches) {
  DataConfig d;
  d.source = "indexed";
  d.blend = std::vector<BlendEntry>{{indexed("a", 60, 64, 1), 2}, {indexed("b", 40, 64, 2), 1}};
  SamplingShape shape;
  shape.seq_len = 16;
  shape.global_batch = 8;
  shape.model_vocab = 64;
  const auto src = make_data_source(d, 7, shape, "cfg.json");
  for (Split split : {Split::kTrain, Split::kVal}) {
    for (uint64_t iter : {0, 1, 5, 40}) {  // 40 batches of 8: past the first epoch of b
      std::vector<int32_t> in(8 * 16), tg(8 * 16), pin(8 * 16), ptg(8 * 16);
      src->sample(split, iter, 0, 8, 16, in.data(), tg.data());
      // Data-parallel ranks and micro-batches draw slices; the batch is the same.
      for (int first : {0, 2, 4, 6})
        src->sample(split, iter, first, 2, 16, pin.data() + first * 16, ptg.data() + first * 16);
      EXPECT_EQ(in, pin) << "iteration " << iter;
      EXPECT_EQ(tg, ptg) << "iteration " << iter;
      for (int r = 0; r < 8; ++r)  // targets are the inputs shifted by one
        for (int i = 0; i + 1 < 16; ++i) EXPECT_EQ(tg[r * 16 + i], in[r * 16 + i + 1]);
    }
  }
}

TEST_F(Datasets, ResumeMidEpochWithABlendIsBitIdentical) {
  const std::string blend = "[{\"path\": \"" + indexed("a", 40, 64, 3) +
                            "\", \"weight\": 0.7}, {\"path\": \"" + indexed("b", 30, 64, 4) +
                            "\", \"weight\": 0.3}]";
  RunContext ctx;
  ctx.verbose = false;
  ctx.single_process = true;
  const TrainResult whole = run_training(load_config("", train_sets(blend)), ctx);
  std::vector<std::string> first = train_sets(blend);
  first.push_back("checkpoint.dir=" + (dir_ / "ckpt").string());
  first.push_back("checkpoint.interval=3");
  first.push_back("train.iterations=3");
  run_training(load_config("", first), ctx);
  std::vector<std::string> rest = first;
  rest.back() = "train.iterations=8";
  const TrainResult resumed = run_training(load_config("", rest), ctx);
  ASSERT_EQ(resumed.start_iteration, 3);
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(resumed.losses[i], whole.losses[3 + i]) << i;
  // Evaluations at iterations 4 and 8 in both runs.
  ASSERT_EQ(resumed.val_losses.size(), 2u);
  EXPECT_EQ(resumed.val_losses, whole.val_losses);
}

TEST_F(Datasets, BadBlendPathsAndTokensAreNamed) {
  const std::string a = indexed("a", 20, 64, 5);
  try {
    RunContext ctx;
    ctx.verbose = false;
    ctx.single_process = true;
    run_training(load_config("", train_sets("[{\"path\": \"" + a +
                                            "\", \"weight\": 1}, "
                                            "{\"path\": \"" +
                                            (dir_ / "missing").string() + "\", \"weight\": 1}]")),
                 ctx);
    FAIL() << "a missing blend path trained";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "data.blend[1].path") << e.what();
    EXPECT_NE(std::string(e.what()).find("missing.idx"), std::string::npos) << e.what();
  }
  // Tokens up to 999 for a model of 64: the first one read is named by file and byte.
  const std::string big = indexed("big", 20, 1000, 6);
  try {
    RunContext ctx;
    ctx.verbose = false;
    ctx.single_process = true;
    std::vector<std::string> sets = train_sets("null");
    sets.push_back("data.path=" + big);
    run_training(load_config("", sets), ctx);
    FAIL() << "tokens beyond the vocabulary trained";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("big.bin: byte"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocabulary 64"), std::string::npos) << e.what();
  }
}

TEST_F(Datasets, PrepareTokenizesEveryDocumentWithItsEndToken) {
  const std::vector<std::string> docs = {"First document, with words.",
                                         "Second: \"quoted\" text\nover two lines.",
                                         "Third — with a dash and digits 12345."};
  {
    std::ofstream j(dir_ / "in.jsonl");
    for (const std::string& d : docs) j << nlohmann::json{{"text", d}}.dump() << "\n";
    std::ofstream t(dir_ / "in.txt");
    for (size_t i = 0; i < docs.size(); ++i) t << docs[i] << (i + 1 < docs.size() ? "\n\n" : "\n");
  }
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(kTokenizer);
  ASSERT_TRUE(tok->eod_id().has_value());
  const std::string out = (dir_ / "out").string();
  ASSERT_EQ(cmd_data({"prepare", "--tokenizer", kTokenizer, "--input", (dir_ / "in.jsonl").string(),
                      "--output", out, "--threads", "2"}),
            0);
  const std::unique_ptr<TokenCorpus> c = open_indexed_dataset(out);
  ASSERT_EQ(c->num_documents(), 3);
  for (int d = 0; d < 3; ++d) {
    std::vector<int32_t> want = tok->encode(docs[static_cast<size_t>(d)]);
    want.push_back(*tok->eod_id());
    std::vector<int32_t> got(static_cast<size_t>(c->document_length(d)));
    c->read(d, 0, static_cast<int64_t>(got.size()), got.data());
    EXPECT_EQ(got, want) << "document " << d;
  }
  // Paragraphs of a text file, as llm.c shards: the same documents, one stream, each after the
  // end token as llm.c's fineweb.py writes them (the stream starts with it).
  ASSERT_EQ(cmd_data({"prepare", "--tokenizer", kTokenizer, "--input", (dir_ / "in.txt").string(),
                      "--output", out + "_llmc", "--format", "llmc", "--documents", "paragraphs"}),
            0);
  const std::unique_ptr<TokenCorpus> s = open_token_shards(out + "_llmc_000000.bin");
  std::vector<int32_t> want;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> ids = tok->encode(docs[d] + "\n");
    want.push_back(*tok->eod_id());
    want.insert(want.end(), ids.begin(), ids.end());
  }
  std::vector<int32_t> got(static_cast<size_t>(s->num_tokens()));
  s->read(0, 0, static_cast<int64_t>(got.size()), got.data());
  EXPECT_EQ(got, want);
  // A JSON line without the field is named by file and line.
  {
    std::ofstream j(dir_ / "bad.jsonl");
    j << "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n";
  }
  try {
    cmd_data({"prepare", "--tokenizer", kTokenizer, "--input", (dir_ / "bad.jsonl").string(),
              "--output", out + "_bad"});
    FAIL() << "a line without text was prepared";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "line 2");
  }
  EXPECT_FALSE(fs::exists(out + "_bad.idx"));  // nothing half-written
}

// A special token written in a document is text by default (tiktoken's encode_ordinary, as
// Megatron's preprocess_data.py and llm.c read documents: a document cannot inject a separator);
// --allow-special makes it the special id (encode(allowed_special="all")).
TEST_F(Datasets, PrepareReadsSpecialTokensInDocumentsAsTextUnlessAllowed) {
  const std::string doc = "one<|endoftext|>two";
  {
    std::ofstream j(dir_ / "in.jsonl");
    j << nlohmann::json{{"text", doc}}.dump() << "\n";
  }
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(kTokenizer);
  const int32_t eod = *tok->eod_id();
  auto prepared = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "prepare",  "--tokenizer",         kTokenizer, "--input", (dir_ / "in.jsonl").string(),
        "--output", (dir_ / name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    EXPECT_EQ(cmd_data(args), 0);
    const std::unique_ptr<TokenCorpus> c = open_indexed_dataset((dir_ / name).string());
    std::vector<int32_t> got(static_cast<size_t>(c->document_length(0)));
    c->read(0, 0, static_cast<int64_t>(got.size()), got.data());
    return got;
  };
  std::vector<int32_t> want = tok->encode_ordinary(doc);
  EXPECT_EQ(std::count(want.begin(), want.end(), eod), 0);
  EXPECT_EQ(tok->decode(want), doc);
  want.push_back(eod);
  EXPECT_EQ(prepared("text", {}), want);
  // Allowed: the text on either side encoded alone, the special id between.
  want = tok->encode("one");
  want.push_back(eod);
  for (int32_t id : tok->encode("two")) want.push_back(id);
  want.push_back(eod);
  EXPECT_EQ(prepared("special", {"--allow-special"}), want);
}

// A tiktoken file whose rank count names no encoding takes --pattern (and --special); Whisper's
// multilingual.tiktoken is such a file, its last rank (50256) an empty token ("=", which Python's
// base64 reads as b""). The fixture mimics it: the GPT-2-style ranks plus "= 4352". Its ids are
// the fixture's (tiktoken's, tests/golden/tokenizer) and <|endoftext|> is the rank count, 4353,
// as Whisper's get_encoding numbers it.
TEST_F(Datasets, PrepareTakesAPatternAndSpecialTokensForAnyTiktokenFile) {
  const std::string ranks = std::string(STRATA_TEST_DIR) + "/golden/tokenizer/gpt2_style.tiktoken";
  std::string text;
  {
    std::ifstream in(ranks, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  const std::string whisper_like = (dir_ / "empty_last.tiktoken").string();
  std::ofstream(whisper_like, std::ios::binary) << text << "= 4352\n";
  {
    std::ofstream t(dir_ / "in.txt");
    t << "Whose words these are I think I know.\n";
  }
  const std::string in = (dir_ / "in.txt").string();
  const std::string out = (dir_ / "w").string();
  try {
    cmd_data({"prepare", "--tokenizer", whisper_like, "--input", in, "--output", out});
    FAIL() << "a tiktoken file of 4353 ranks was read without a pattern";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), whisper_like);
    EXPECT_NE(std::string(e.what()).find("--pattern"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cmd_data({"prepare", "--tokenizer", whisper_like, "--input", in, "--output", out,
                      "--pattern", "gpt2"}),
            0);
  const std::unique_ptr<Tokenizer> fixture = Tokenizer::load(ranks, "gpt2");
  std::vector<int32_t> want = fixture->encode_ordinary("Whose words these are I think I know.\n");
  want.push_back(4353);
  auto document = [](const std::string& prefix) {
    const std::unique_ptr<TokenCorpus> c = open_indexed_dataset(prefix);
    std::vector<int32_t> got(static_cast<size_t>(c->document_length(0)));
    c->read(0, 0, static_cast<int64_t>(got.size()), got.data());
    return got;
  };
  EXPECT_EQ(document(out), want);
  const std::unique_ptr<Tokenizer> w = Tokenizer::load(whisper_like, "gpt2");
  EXPECT_EQ(w->decode({4352}), "");
  EXPECT_EQ(w->eod_id(), std::optional<int32_t>(4353));
  // --special replaces the pattern's special tokens.
  ASSERT_EQ(cmd_data({"prepare", "--tokenizer", whisper_like, "--input", in, "--output", out + "s",
                      "--pattern", "gpt2", "--special", "<|endoftext|>=5000", "--special",
                      "<|other|>=5001"}),
            0);
  want.back() = 5000;
  EXPECT_EQ(document(out + "s"), want);
  // Bad flags are named: a tokenizer.json has its own pattern; NAME=ID; an id a rank holds.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--tokenizer", kTokenizer, "--pattern", "gpt2"}, "--pattern"},
      {{"--tokenizer", whisper_like, "--pattern", "gpt2", "--special", "<|x|>"}, "--special"},
      {{"--tokenizer", whisper_like, "--pattern", "gpt2", "--special", "<|x|>=-1"}, "--special"},
      {{"--tokenizer", whisper_like, "--pattern", "gpt2", "--special", "<|x|>=1", "--special",
        "<|x|>=2"},
       "--special"},
      {{"--tokenizer", whisper_like, "--pattern", "gpt2", "--special", "<|endoftext|>=7"},
       "special token \"<|endoftext|>\""},
      {{"--tokenizer", whisper_like, "--pattern", "(unclosed"}, "pattern"}};
  for (const auto& [flags, where] : bad) {
    std::vector<std::string> args = {"prepare", "--input", in, "--output", out + "_bad"};
    args.insert(args.end(), flags.begin(), flags.end());
    try {
      cmd_data(args);
      ADD_FAILURE() << "prepared with " << flags.back();
    } catch (const InputError& e) {
      EXPECT_EQ(e.where(), where) << e.what();
    }
  }
}

// Invalid UTF-8 in a text input is read as U+FFFD, as the tokenizer reads it everywhere (Python's
// errors="replace"), and the summary counts it and names the first.
TEST_F(Datasets, PrepareReplacesAndCountsInvalidUtf8) {
  const std::string text = "ok \xFF and \xE2\x82 end\n";
  std::ofstream(dir_ / "bad.txt", std::ios::binary) << text;
  const std::string out = (dir_ / "u").string();
  ::testing::internal::CaptureStdout();
  const int status = cmd_data({"prepare", "--tokenizer", kTokenizer, "--input",
                               (dir_ / "bad.txt").string(), "--output", out});
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(status, 0);
  EXPECT_NE(printed.find("2 invalid UTF-8 sequence(s) read as U+FFFD (the first at " +
                         (dir_ / "bad.txt").string() + ": byte 3)"),
            std::string::npos)
      << printed;
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(kTokenizer);
  std::vector<int32_t> want = tok->encode("ok \xEF\xBF\xBD and \xEF\xBF\xBD end\n");
  want.push_back(*tok->eod_id());
  const std::unique_ptr<TokenCorpus> c = open_indexed_dataset(out);
  std::vector<int32_t> got(static_cast<size_t>(c->document_length(0)));
  c->read(0, 0, static_cast<int64_t>(got.size()), got.data());
  EXPECT_EQ(got, want);
}

// A document the tokenizer's pattern gives up on (PCRE2's match limit) stops the prepare with an
// error naming the document (input file and line) and the pattern (before: the rest of the
// document went unsplit and prepare exited 0).
TEST_F(Datasets, PrepareNamesTheDocumentAPatternGivesUpOn) {
  std::ifstream in(kTokenizer);
  nlohmann::json j = nlohmann::json::parse(in);
  j["pre_tokenizer"] = test_fixtures::split_pre_tokenizer("(a|aa)+$");
  const std::string tok = (dir_ / "backtrack.json").string();
  std::ofstream(tok) << j.dump();
  {
    std::ofstream f(dir_ / "docs.jsonl");
    f << "{\"text\": \"aaa\"}\n{\"text\": \"" << std::string(60, 'a') << "b\"}\n";
  }
  try {
    cmd_data({"prepare", "--tokenizer", tok, "--input", (dir_ / "docs.jsonl").string(), "--output",
              (dir_ / "bt").string(), "--threads", "2"});
    FAIL() << "a document the pattern gave up on was prepared";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), (dir_ / "docs.jsonl").string());
    EXPECT_EQ(e.where(), "line 2");
    EXPECT_NE(std::string(e.what()).find(tok + ": pre_tokenizer.pretokenizers[0].pattern.Regex"),
              std::string::npos)
        << e.what();
  }
}

// Outputs are published together or not at all (docs/data.md): a rerun with fewer llm.c shards
// leaves none of the earlier run's tail for the glob to match; a run that fails publishes no
// shard; a Megatron output whose PREFIX.idx is a directory moves no PREFIX.bin into place
// (before: stale shards stayed, a failed run left complete-looking shards, PREFIX.bin was renamed
// before PREFIX.idx failed).
TEST_F(Datasets, PrepareOutputsArePublishedTogether) {
  std::string doc;
  for (int i = 0; i < 400; ++i) doc += "word" + std::to_string(i % 37) + " ";
  {
    std::ofstream t(dir_ / "in.txt");
    t << doc;
  }
  const std::string out = (dir_ / "sh").string();
  auto prepare = [&](const std::string& input, const std::string& shard_tokens) {
    return cmd_data({"prepare", "--tokenizer", kTokenizer, "--input", input, "--output", out,
                     "--format", "llmc", "--shard-tokens", shard_tokens, "--threads", "1"});
  };
  auto shards = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_))
      n += e.path().filename().string().rfind("sh_", 0) == 0;
    return n;
  };
  ASSERT_EQ(prepare((dir_ / "in.txt").string(), "100"), 0);
  const int many = shards();
  ASSERT_GT(many, 3);
  ASSERT_EQ(prepare((dir_ / "in.txt").string(), "100000"), 0);
  EXPECT_EQ(shards(), 1) << "the earlier run's shards past the first were left";
  // A run that fails part-way (its second document is refused) publishes nothing new.
  {
    std::ofstream j(dir_ / "bad.jsonl");
    j << nlohmann::json{{"text", doc}}.dump() << "\n{\"body\": 1}\n";
  }
  fs::remove(out + "_000000.bin");
  EXPECT_THROW(prepare((dir_ / "bad.jsonl").string(), "100"), InputError);
  EXPECT_EQ(shards(), 0);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  // Megatron: PREFIX.idx is a directory: neither file is put in place.
  fs::create_directories(out + "_m.idx");
  EXPECT_THROW(cmd_data({"prepare", "--tokenizer", kTokenizer, "--input",
                         (dir_ / "in.txt").string(), "--output", out + "_m"}),
               InputError);
  EXPECT_FALSE(fs::exists(out + "_m.bin"));
}

// JSON Lines as Python reads them: a lone surrogate escape is U+FFFD (before, it cost the whole
// input: nlohmann's parser refuses it), a pair stays the character it encodes; nesting deeper
// than the config reader's 64 is refused at its line, without building the structure (a 50 MB
// line of '[' took 4 GB before its refusal).
TEST_F(Datasets, PrepareReadsLoneSurrogatesAsReplacementAndBoundsNesting) {
  {
    std::ofstream j(dir_ / "sur.jsonl");
    j << "{\"text\": \"a\\udcffb\"}\n{\"text\": \"x\\ud83d\\ude00y \\\\udcff\"}\n";
  }
  const std::string out = (dir_ / "sur").string();
  ASSERT_EQ(cmd_data({"prepare", "--tokenizer", kTokenizer, "--input",
                      (dir_ / "sur.jsonl").string(), "--output", out, "--threads", "1"}),
            0);
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(kTokenizer);
  const std::unique_ptr<TokenCorpus> c = open_indexed_dataset(out);
  ASSERT_EQ(c->num_documents(), 2);
  const std::vector<std::string> want = {
      "a\xEF\xBF\xBD"
      "b",
      "x\xF0\x9F\x98\x80y \\udcff"};
  for (int d = 0; d < 2; ++d) {
    std::vector<int32_t> ids = tok->encode(want[static_cast<size_t>(d)]);
    ids.push_back(*tok->eod_id());
    std::vector<int32_t> got(static_cast<size_t>(c->document_length(d)));
    c->read(d, 0, static_cast<int64_t>(got.size()), got.data());
    EXPECT_EQ(got, ids) << "document " << d;
  }
  {
    std::ofstream j(dir_ / "deep.jsonl");
    j << "{\"text\": \"ok\"}\n" << std::string(1000000, '[') << "\n";
  }
  try {
    cmd_data({"prepare", "--tokenizer", kTokenizer, "--input", (dir_ / "deep.jsonl").string(),
              "--output", out + "_deep"});
    FAIL() << "a line nested a million deep was read";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where().rfind("line 2", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("nested at most 64 deep"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
