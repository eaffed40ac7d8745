// test_tokenizer — Strata's byte-level BPE against Hugging Face tokenizers and tiktoken.
//
// The expected ids come from outside: tests/golden/tokenizer/make_tokenizer_fixtures.py trains
// two tokenizers (GPT-2 and Llama 3 pre-tokenization) on tinyshakespeare, writes each as a
// tokenizer.json and a tiktoken ranks file, and stores the ids both references give (they
// agree) on a Unicode stress text, on invalid UTF-8 and on the whole corpus. Every golden is
// checked against both file kinds. The corpus checks need ../shared/data/tinyshakespeare.txt
// (the same file the fixtures were made from) and skip without it.
//
// Also: decode(encode(x)) == x, special tokens, encode_batch on several threads == serial, and
// the InputErrors of bad files (file and JSON key or line named).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/tokenizer.h"
#include "tests/tokenizer_fixtures.h"

namespace strata {
namespace {

const std::string kDir = std::string(STRATA_TEST_DIR) + "/golden/tokenizer/";
const std::string kCorpus = std::string(STRATA_SHARED_DATA_DIR) + "/tinyshakespeare.txt";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> read_ids(const std::string& path, int width) {
  const std::string raw = read_file(path);
  std::vector<int32_t> ids(raw.size() / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, raw.data() + i * width, width);  // little-endian files, little-endian hosts
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

nlohmann::json golden_manifest() {
  return nlohmann::json::parse(read_file(kDir + "golden.json"));
}

// The index of the first difference, or -1; prints the neighbourhood when they differ.
int64_t first_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  return got.size() == want.size() ? -1 : static_cast<int64_t>(n);
}

// A file in a folder of this process's own, removed when the process ends (ctest runs this
// binary's tests two at a time in the sanitizer stages: one name written by two processes at
// once would be read half-written).
std::string write_temp(const std::string& name, const std::string& contents) {
  static const struct Scratch {
    std::string dir = testing::TempDir() + "strata_tok_" + std::to_string(::getpid());
    Scratch() { std::filesystem::create_directories(dir); }
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } scratch;
  const std::string path = scratch.dir + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

struct Case {
  std::string name;  // gpt2_style, llama3_style
  // tokenizer.json or tiktoken; or "converted": the tiktoken file written as a tokenizer.json by
  // Tokenizer::hf_tokenizer_json (what strata export writes for a tiktoken run), read back.
  std::string kind;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const std::string& k = info.param.kind;
  return info.param.name + (k == "tiktoken"    ? "_tiktoken"
                            : k == "converted" ? "_converted"
                                               : "_json");
}

class TokenizerGolden : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    const std::string pattern = c.name == "gpt2_style" ? "gpt2" : "llama3";
    if (c.kind == "converted") {
      const auto tiktoken = Tokenizer::load(kDir + c.name + ".tiktoken", pattern);
      tok_ = Tokenizer::load(write_temp(c.name + ".converted.json", tiktoken->hf_tokenizer_json()));
      ASSERT_TRUE(tok_->tiktoken_regex().empty());  // read as a tokenizer.json
      return;
    }
    tok_ = Tokenizer::load(kDir + c.name + "." + c.kind, pattern);
  }
  void expect_golden(const std::string& input_text, const std::string& golden, int width) {
    const std::vector<int32_t> want = read_ids(kDir + GetParam().name + "." + golden, width);
    const std::vector<int32_t> got = tok_->encode(input_text);
    const int64_t d = first_difference(got, want);
    EXPECT_EQ(d, -1) << "first difference at id " << d << " of " << want.size() << " (got "
                     << got.size() << " ids)";
    std::printf("[ golden   ] %s %s %s: %zu ids compared\n", GetParam().name.c_str(),
                GetParam().kind.c_str(), golden.c_str(), want.size());
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(TokenizerGolden, StressTextMatchesReferences) {
  expect_golden(read_file(kDir + "stress.txt"), "stress.ids", 4);
}

TEST_P(TokenizerGolden, InvalidUtf8IsReadAsPythonsReplace) {
  expect_golden(read_file(kDir + "stress_invalid.bin"), "stress_invalid.ids", 4);
}

TEST_P(TokenizerGolden, WholeCorpusMatchesReferences) {
  std::ifstream probe(kCorpus);
  if (!probe) GTEST_SKIP() << kCorpus << " is absent (the shared data folder)";
  const std::string text = read_file(kCorpus);
  const auto m = golden_manifest();
  if (text.size() != m["corpus_bytes"].get<size_t>())
    GTEST_SKIP() << kCorpus << " is not the corpus the fixtures were made from";
  expect_golden(text, "corpus.ids", 2);
}

TEST_P(TokenizerGolden, VocabSizeAndSpecialTokens) {
  const auto m = golden_manifest();
  const bool gpt2 = GetParam().name == "gpt2_style";
  EXPECT_EQ(tok_->vocab_size(), m["tokenizers"][GetParam().name]["vocab_size"].get<int>());
  // The specials follow the 4096 merges and the 256 bytes.
  if (gpt2) {
    EXPECT_EQ(tok_->token_id("<|endoftext|>"), 4352);
    EXPECT_EQ(tok_->eod_id(), 4352);
  } else {
    EXPECT_EQ(tok_->token_id("<|begin_of_text|>"), 4352);
    EXPECT_EQ(tok_->token_id("<|end_of_text|>"), 4353);
    EXPECT_EQ(tok_->token_id("<|eot_id|>"), 4361);
    EXPECT_EQ(tok_->token_id("<|reserved_special_token_250|>"), 4607);
    EXPECT_EQ(tok_->eod_id(), 4353);
  }
  EXPECT_FALSE(tok_->token_id("<|no such token|>").has_value());
  const int32_t eod = *tok_->eod_id();
  const std::string eod_text = gpt2 ? "<|endoftext|>" : "<|end_of_text|>";
  // Recognised inside words by encode(), plain text to encode_ordinary().
  const auto ids = tok_->encode("First" + eod_text + "Citizen");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eod), 1);
  EXPECT_EQ(tok_->decode(ids), "First" + eod_text + "Citizen");
  const auto plain = tok_->encode_ordinary("First" + eod_text + "Citizen");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eod), 0);
  EXPECT_EQ(tok_->decode(plain), "First" + eod_text + "Citizen");
  // A regular token by its text; for a tokenizer.json also by its byte-level spelling.
  const auto the = tok_->token_id(" the");
  ASSERT_TRUE(the.has_value());
  EXPECT_EQ(tok_->encode(" the"), std::vector<int32_t>{*the});
  if (GetParam().kind == "tokenizer.json") {
    EXPECT_EQ(tok_->token_id("\xC4\xA0the"), the);
  }
}

TEST_P(TokenizerGolden, DecodeInvertsEncode) {
  const std::string stress = read_file(kDir + "stress.txt");
  EXPECT_EQ(tok_->decode(tok_->encode(stress)), stress);
  EXPECT_EQ(tok_->decode(tok_->encode_ordinary(stress)), stress);
  std::ifstream probe(kCorpus);
  if (probe) {
    const std::string text = read_file(kCorpus);
    EXPECT_EQ(tok_->decode(tok_->encode(text)), text);
  }
  EXPECT_TRUE(tok_->encode("").empty());
  EXPECT_EQ(tok_->decode({}), "");
  EXPECT_THROW(tok_->decode({tok_->vocab_size()}), InputError);
  EXPECT_THROW(tok_->decode({-1}), InputError);
}

TEST_P(TokenizerGolden, BatchOnThreadsEqualsSerial) {
  // Paragraphs of the stress text and of the corpus (when present), as documents.
  std::string text = read_file(kDir + "stress.txt");
  std::ifstream probe(kCorpus);
  if (probe) text += read_file(kCorpus);
  std::vector<std::string> docs;
  for (size_t from = 0; from < text.size();) {
    size_t to = text.find("\n\n", from);
    to = to == std::string::npos ? text.size() : to + 2;
    docs.push_back(text.substr(from, to - from));
    from = to;
  }
  docs.push_back("");
  std::vector<std::vector<int32_t>> serial;
  for (const auto& d : docs) serial.push_back(tok_->encode(d));
  for (int threads : {1, 2, 4}) {
    const auto batch = tok_->encode_batch(docs, threads);
    ASSERT_EQ(batch.size(), docs.size());
    size_t same = 0;
    for (size_t i = 0; i < docs.size(); ++i) same += batch[i] == serial[i];
    EXPECT_EQ(same, docs.size()) << threads << " threads";
  }
  // The whole of a multi-document batch equals the whole text's encoding where documents end
  // at a blank line (every regex here splits "\n\n" off the following word).
  std::vector<int32_t> joined;
  for (const auto& ids : serial) joined.insert(joined.end(), ids.begin(), ids.end());
  EXPECT_EQ(tok_->decode(joined), text);
}

INSTANTIATE_TEST_SUITE_P(
    BothReferences, TokenizerGolden,
    testing::Values(Case{"gpt2_style", "tokenizer.json"}, Case{"gpt2_style", "tiktoken"},
                    Case{"gpt2_style", "converted"}, Case{"llama3_style", "tokenizer.json"},
                    Case{"llama3_style", "tiktoken"}, Case{"llama3_style", "converted"}),
    case_name);

// tokenizer.json options tiktoken has no counterpart for (add_prefix_space, ignore_merges, the
// Split behaviours, a String pattern): the base fixture with keys changed as golden.json says,
// against the ids tokenizers gives on the stress text.
TEST(Tokenizer, HuggingFaceVariantsMatchTokenizers) {
  const auto m = golden_manifest();
  const std::string stress = read_file(kDir + "stress.txt");
  ASSERT_GE(m["variants"].size(), 8u);
  for (const auto& [name, v] : m["variants"].items()) {
    auto j =
        nlohmann::json::parse(read_file(kDir + v["base"].get<std::string>() + ".tokenizer.json"));
    for (const auto& change : v["patch"])
      j[nlohmann::json::json_pointer(change[0].get<std::string>())] = change[1];
    const auto tok = Tokenizer::load(write_temp(name + ".json", j.dump()));
    const std::vector<int32_t> want = read_ids(kDir + "variant." + name + ".stress.ids", 4);
    const std::vector<int32_t> got = tok->encode(stress);
    const int64_t d = first_difference(got, want);
    EXPECT_EQ(d, -1) << name << ": first difference at id " << d << " of " << want.size();
    std::printf("[ golden   ] variant %s: %zu ids compared\n", name.c_str(), want.size());
  }
}

// Both file kinds of one tokenizer load to the same tokenizer.
TEST(Tokenizer, JsonAndTiktokenAgreeOnMisc) {
  for (const std::string name : {"gpt2_style", "llama3_style"}) {
    const auto a = Tokenizer::load(kDir + name + ".tokenizer.json");
    const auto b =
        Tokenizer::load(kDir + name + ".tiktoken", name == "gpt2_style" ? "gpt2" : "llama3");
    for (const std::string& s :
         std::vector<std::string>{"", " ", "  \n\n\t x", "a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                  std::string(5000, 'e') + " " + std::string(3000, ' ') + "z"}) {
      EXPECT_EQ(a->encode(s), b->encode(s)) << name << " on \"" << s.substr(0, 40) << "\"";
      EXPECT_EQ(a->decode(a->encode(s)), s);
    }
  }
}

// Explicit special tokens for a tiktoken file.
TEST(Tokenizer, TiktokenExplicitSpecials) {
  const auto t = Tokenizer::load_tiktoken(kDir + "gpt2_style.tiktoken", "gpt2",
                                          {{"<|a|>", 5000}, {"<|a|>b", 5001}});
  EXPECT_EQ(t->vocab_size(), 5002);
  EXPECT_FALSE(t->eod_id().has_value());
  // Leftmost-longest.
  const auto ids = t->encode("x<|a|>b<|a|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[ids.size() - 2], 5001);
  EXPECT_EQ(ids.back(), 5000);
}

// Hugging Face's added tokens: lstrip / rstrip absorb the whitespace beside the token.
TEST(Tokenizer, AddedTokenStrip) {
  auto j = nlohmann::json::parse(read_file(kDir + "gpt2_style.tokenizer.json"));
  j["added_tokens"].push_back({{"id", 4353},
                               {"content", "<mask>"},
                               {"single_word", false},
                               {"lstrip", true},
                               {"rstrip", true},
                               {"normalized", false},
                               {"special", true}});
  const auto t = Tokenizer::load(write_temp("strip.json", j.dump()));
  const auto base = Tokenizer::load(kDir + "gpt2_style.tokenizer.json");
  std::vector<int32_t> want = base->encode("a");
  want.push_back(4353);
  const auto b = base->encode("b");
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(t->encode("a \t<mask>  \nb"), want);
}

void expect_input_error(const std::string& path, const std::string& where,
                        const std::string& pattern = "") {
  try {
    Tokenizer::load(path, pattern);
    ADD_FAILURE() << path << ": no InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.where().substr(0, where.size()), where) << e.what();
    std::printf("[ error    ] %s\n", e.what());
  }
}

TEST(Tokenizer, BadFilesAreInputErrors) {
  expect_input_error(testing::TempDir() + "strata_tok_missing.json", "");
  expect_input_error(write_temp("notjson.json", "{\"model\": [1, 2"), "byte ");
  auto base = nlohmann::json::parse(read_file(kDir + "gpt2_style.tokenizer.json"));

  auto j = base;
  j["model"]["type"] = "WordPiece";
  expect_input_error(write_temp("wordpiece.json", j.dump()), "model.type");
  j = base;
  j["model"]["merges"][7] = "Ġ zzzunknown";
  expect_input_error(write_temp("unknown_merge.json", j.dump()), "model.merges[7]");
  j = base;
  j["model"]["merges"][3] = {"a"};
  expect_input_error(write_temp("bad_merge.json", j.dump()), "model.merges[3]");
  j = base;
  j["model"].erase("vocab");
  expect_input_error(write_temp("no_vocab.json", j.dump()), "model.vocab");
  j = base;
  j["model"]["vocab"].erase("a");
  expect_input_error(write_temp("no_byte.json", j.dump()), "model.");
  j = base;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_input_error(write_temp("whitespace.json", j.dump()), "pre_tokenizer.type");
  j = base;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}}}};
  expect_input_error(write_temp("badregex.json", j.dump()),
                     "pre_tokenizer.pretokenizers[0].pattern.Regex");
  j = base;
  j["normalizer"] = {{"type", "NFC"}};
  expect_input_error(write_temp("nfc.json", j.dump()), "normalizer");
  j = base;
  j["added_tokens"][0]["id"] = "x";
  expect_input_error(write_temp("added.json", j.dump()), "added_tokens[0].id");

  // An added token given an id a vocabulary token holds ("<|endoftext|>" at 300, "Ġof"'s) is
  // refused (before, both encoded to 300); the same token listed again at its own id is not.
  j = base;
  j["added_tokens"][0]["id"] = 300;
  expect_input_error(write_temp("collide.json", j.dump()), "added_tokens[0].id");
  j = base;
  j["added_tokens"].push_back(j["added_tokens"][0]);
  EXPECT_NO_THROW(Tokenizer::load(write_temp("twice.json", j.dump())));

  const std::string ranks = read_file(kDir + "gpt2_style.tiktoken");
  // Ranks with a gap: 4352 lines whose last rank is 4352 (not 4351), so the end token (at the
  // count, 4352) would take a rank of the file (before: accepted, colliding ids).
  {
    std::string gap = ranks;
    const size_t last = gap.rfind(' ', gap.size() - 2);
    gap = gap.substr(0, last + 1) + "4352\n";
    expect_input_error(write_temp("gap.tiktoken", gap), "special token \"<|endoftext|>\"", "gpt2");
  }
  expect_input_error(write_temp("bad.tiktoken", "IQ== 0\nnot-base64! 1\n"), "line 2", "gpt2");
  expect_input_error(write_temp("dup.tiktoken", ranks + "IQ== 9999\n"), "line 4353", "gpt2");
  expect_input_error(write_temp("nopattern.tiktoken", ranks), "");
  expect_input_error(write_temp("short.tiktoken", "IQ== 0\n"), "", "gpt2");
}

// A pre-tokenizer pattern PCRE2 gives up on (catastrophic backtracking hits its match limit) is
// an error naming the pattern, in encode and in encode_batch's threads (before, the rest of the
// document was left unsplit and the run exited 0).
TEST(Tokenizer, PatternThatGivesUpIsAnError) {
  auto j = nlohmann::json::parse(read_file(kDir + "gpt2_style.tokenizer.json"));
  j["pre_tokenizer"] = test_fixtures::split_pre_tokenizer("(a|aa)+$");
  const std::string path = write_temp("backtrack.json", j.dump());
  const std::unique_ptr<Tokenizer> t = Tokenizer::load(path);
  EXPECT_FALSE(t->encode("aaaa").empty());  // fine on short text
  const std::string bad = std::string(60, 'a') + "b";
  try {
    t->encode(bad);
    ADD_FAILURE() << "a pattern that gave up split the text";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.where(), "pre_tokenizer.pretokenizers[0].pattern.Regex") << e.what();
    EXPECT_NE(std::string(e.what()).find("gave up at byte 0"), std::string::npos) << e.what();
  }
  size_t failed = 99;
  EXPECT_THROW(t->encode_batch({"aa", "aaa", bad, "a"}, 3, &failed), InputError);
  EXPECT_EQ(failed, 2u);
}

}  // namespace
}  // namespace strata
