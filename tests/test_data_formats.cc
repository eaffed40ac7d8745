// test_data_formats.cc — the token formats of runtime/data/: MappedFile, Megatron's indexed
// dataset and llm.c's token shards.
//
// Expected values come from outside the code under test: index and shard bytes encoded here by
// hand from the published layouts (megatron/core/datasets/indexed_dataset.py, llm.c's
// dev/data/data_common.py), and fixtures written by megatron-core itself
// (tests/golden/megatron/, make_megatron_fixtures.py) with their documents as JSON. Every bad
// input is checked for the file, the byte offset and the words of its one-line error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/indexed.h"
#include "runtime/data/mmap_file.h"
#include "runtime/data/token_shards.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Docs = std::vector<std::vector<int32_t>>;

InputError expect_input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an InputError";
  return InputError("", "", "");
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Little-endian encoding, written independently of the library.
template <typename T>
void put(std::string* s, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    s->push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i) & 0xFF));
  }
}

template <typename T>
void poke(std::string* s, size_t at, T v) {
  std::string b;
  put(&b, v);
  s->replace(at, b.size(), b);
}

// A Megatron .idx as indexed_dataset.py's _IndexWriter lays it out.
std::string encode_idx(uint8_t code, const std::vector<int32_t>& lengths,
                       const std::vector<int64_t>& pointers, const std::vector<int64_t>& docs) {
  std::string s("MMIDIDX\0\0", 9);
  put<uint64_t>(&s, 1);
  put<uint8_t>(&s, code);
  put<uint64_t>(&s, lengths.size());
  put<uint64_t>(&s, docs.size());
  for (int32_t l : lengths) put(&s, l);
  for (int64_t p : pointers) put(&s, p);
  for (int64_t d : docs) put(&s, d);
  return s;
}

// One sequence per document, contiguous, as IndexedDatasetBuilder writes GPT data.
std::string encode_idx(uint8_t code, int width, const Docs& docs) {
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, indices{0};
  int64_t p = 0;
  for (const auto& d : docs) {
    lengths.push_back(static_cast<int32_t>(d.size()));
    pointers.push_back(p);
    p += static_cast<int64_t>(d.size()) * width;
    indices.push_back(static_cast<int64_t>(lengths.size()));
  }
  return encode_idx(code, lengths, pointers, indices);
}

template <typename T>
std::string encode_tokens(const Docs& docs) {
  std::string s;
  for (const auto& d : docs) {
    for (int32_t t : d) put(&s, static_cast<T>(t));
  }
  return s;
}

Docs random_docs(int n, int max_len, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Docs docs(n);
  for (int i = 0; i < n; ++i) {
    docs[i].resize(rng() % (max_len + 1));
    for (auto& t : docs[i]) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  }
  return docs;
}

std::vector<int32_t> read_document(const TokenCorpus& c, int64_t d) {
  std::vector<int32_t> out(static_cast<size_t>(c.document_length(d)), -1);
  c.read(d, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

void expect_documents(const TokenCorpus& c, const Docs& docs) {
  ASSERT_EQ(c.num_documents(), static_cast<int64_t>(docs.size()));
  int64_t total = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_EQ(c.document_length(static_cast<int64_t>(d)), static_cast<int64_t>(docs[d].size()))
        << "document " << d;
    ASSERT_EQ(read_document(c, static_cast<int64_t>(d)), docs[d]) << "document " << d;
    total += static_cast<int64_t>(docs[d].size());
  }
  EXPECT_EQ(c.num_tokens(), total);
}

Docs load_json_documents(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  const nlohmann::json j = nlohmann::json::parse(in);
  return j.at("documents").get<Docs>();
}

class Formats : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_formats_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // PREFIX.idx and PREFIX.bin from bytes.
  std::string dataset(const std::string& name, const std::string& idx, const std::string& bin) {
    write_bytes(path(name) + ".idx", idx);
    write_bytes(path(name) + ".bin", bin);
    return path(name);
  }

  fs::path dir_;
};

const std::string kGolden = std::string(STRATA_TEST_DIR) + "/golden/megatron/";

// ---- MappedFile ----

TEST_F(Formats, MappedFileReadsBytesAndMoves) {
  write_bytes(path("f"), "hello");
  MappedFile m = MappedFile::open(path("f"));
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), 5), "hello");
  MappedFile moved = std::move(m);
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(moved.size(), 5u);
  EXPECT_EQ(moved.path(), path("f"));
  MappedFile assigned;
  assigned = std::move(moved);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(assigned.data()), 5), "hello");
}

TEST_F(Formats, MappedFileEmptyAndMissing) {
  write_bytes(path("empty"), "");
  const MappedFile m = MappedFile::open(path("empty"), MappedFile::Access::kRandom);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.data(), nullptr);
  const InputError e = expect_input_error([&] { MappedFile::open(path("nope")); });
  EXPECT_EQ(e.file(), path("nope"));
  EXPECT_TRUE(contains(e.expected(), "an existing file")) << e.what();
  const InputError d = expect_input_error([&] { MappedFile::open(dir_.string()); });
  EXPECT_TRUE(contains(d.what(), "a regular file")) << d.what();
}

// A file truncated under its mapping (a dataset rewritten while a job reads it): reading a lost
// page ends the process with status 1 and a line naming the file (before: SIGBUS, no message).
// The mappings made and released before the truncated one leave their slots free (a moved-from
// and a released mapping name nothing).
TEST_F(Formats, MappedFileTruncatedUnderTheMappingNamesTheFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  write_bytes(path("data.bin"), std::string(1 << 16, 'x'));
  for (int i = 0; i < 3; ++i) MappedFile::open(path("data.bin"));  // released at once
  EXPECT_EXIT(
      {
        const MappedFile m = MappedFile::open(path("data.bin"));
        ::truncate(path("data.bin").c_str(), 0);
        volatile uint8_t sink = m.data()[40000];
        (void)sink;
      },
      ::testing::ExitedWithCode(1),
      "data.bin: the file changed while the job read it \\(truncated or rewritten: no byte 40000");
}

// A glob over more shards than the process may map (half of vm.max_map_count) is refused at
// open, naming the pattern and both numbers (before: "Cannot allocate memory" part-way, 66,000
// shards against the default 65,530).
TEST_F(Formats, TooManyShardsToMapAreRefusedWithTheLimit) {
  const std::vector<int32_t> t = {1, 2, 3};
  for (int i = 0; i < 3; ++i)
    write_token_shard(path("s_" + std::to_string(i) + ".bin"), t.data(), 3, 2);
  ::setenv("STRATA_TEST_MAX_MAP_COUNT", "4", 1);
  const InputError e = expect_input_error([&] { open_token_shards(path("s_*.bin")); });
  ::unsetenv("STRATA_TEST_MAX_MAP_COUNT");
  EXPECT_EQ(e.file(), path("s_*.bin"));
  EXPECT_TRUE(contains(e.expected(), "at most 2 shards")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "found 3")) << e.what();
  EXPECT_EQ(open_token_shards(path("s_*.bin"))->num_tokens(), 9);
}

// ---- Megatron indexed dataset: writer and reader ----

TEST(IndexedDataset, OptimalTokenBytesFollowsMegatron) {
  // DType.optimal_dtype: uint16 when cardinality < 65500, else int32.
  EXPECT_EQ(optimal_token_bytes(256), 2);
  EXPECT_EQ(optimal_token_bytes(50257), 2);  // GPT-2
  EXPECT_EQ(optimal_token_bytes(65499), 2);
  EXPECT_EQ(optimal_token_bytes(65500), 4);
  EXPECT_EQ(optimal_token_bytes(65536), 4);
  EXPECT_EQ(optimal_token_bytes(128256), 4);  // Llama 3
}

TEST_F(Formats, IndexedWriterBytesAreMegatronsLayout) {
  const Docs docs{{1, 2, 3}, {}, {65535}, {7, 0}};
  for (int width : {2, 4}) {
    const std::string prefix = path("w" + std::to_string(width));
    IndexedDatasetWriter w(prefix, width);
    for (const auto& d : docs) w.add_document(d.data(), static_cast<int64_t>(d.size()));
    EXPECT_EQ(w.num_documents(), 4);
    EXPECT_EQ(w.num_tokens(), 6);
    w.finish();
    EXPECT_EQ(read_bytes(prefix + ".idx"), encode_idx(width == 2 ? 8 : 4, width, docs));
    EXPECT_EQ(read_bytes(prefix + ".bin"),
              width == 2 ? encode_tokens<uint16_t>(docs) : encode_tokens<int32_t>(docs));
  }
  // Only the two files: the temporaries were renamed away.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 4);
}

TEST_F(Formats, IndexedRoundTripBothDtypes) {
  for (int width : {2, 4}) {
    const Docs docs = random_docs(500, 300, width == 2 ? 65536 : 1 << 20, 11 + width);
    const std::string prefix = path("rt" + std::to_string(width));
    IndexedDatasetWriter w(prefix, width);
    for (const auto& d : docs) w.add_document(d.data(), static_cast<int64_t>(d.size()));
    w.finish();
    const auto c = open_indexed_dataset(prefix);
    EXPECT_EQ(c->path(), prefix);
    EXPECT_EQ(c->token_bytes(), width);
    expect_documents(*c, docs);
    // A window in the middle of a document.
    int64_t d = 0;
    while (docs[d].size() < 10) ++d;
    std::vector<int32_t> out(5);
    c->read(d, 3, 5, out.data());
    EXPECT_EQ(out, std::vector<int32_t>(docs[d].begin() + 3, docs[d].begin() + 8));
    EXPECT_THROW(c->read(d, 3, static_cast<int64_t>(docs[d].size()), out.data()),
                 std::out_of_range);
    EXPECT_THROW(c->document_length(c->num_documents()), std::out_of_range);
  }
}

TEST_F(Formats, IndexedLocateGivesTheByteOfTheToken) {
  const Docs docs{{5, 6, 7}, {}, {8, 9, 10, 11}};
  for (int width : {2, 4}) {
    const std::string prefix = path("loc" + std::to_string(width));
    IndexedDatasetWriter w(prefix, width);
    for (const auto& d : docs) w.add_document(d.data(), static_cast<int64_t>(d.size()));
    w.finish();
    const auto c = open_indexed_dataset(prefix);
    EXPECT_EQ(c->locate(0, 0), prefix + ".bin: byte 0");
    EXPECT_EQ(c->locate(2, 2), prefix + ".bin: byte " + std::to_string((3 + 2) * width));
    EXPECT_THROW(c->locate(1, 0), std::out_of_range);  // empty document
  }
}

TEST_F(Formats, IndexedWriterIsAtomicAndChecksTokens) {
  const std::vector<int32_t> a{1, 2, 3};
  {
    IndexedDatasetWriter w(path("ds"), 2);
    w.add_document(a.data(), 3);
    w.finish();
    EXPECT_THROW(w.finish(), std::logic_error);
    EXPECT_THROW(w.add_document(a.data(), 3), std::logic_error);
  }
  const std::string idx = read_bytes(path("ds.idx")), bin = read_bytes(path("ds.bin"));
  {
    // Abandoned before finish(): the old dataset stays, no temporary is left.
    IndexedDatasetWriter w(path("ds"), 4);
    w.add_document(a.data(), 3);
    w.add_document(a.data(), 2);
  }
  EXPECT_EQ(read_bytes(path("ds.idx")), idx);
  EXPECT_EQ(read_bytes(path("ds.bin")), bin);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);

  IndexedDatasetWriter w(path("bad"), 2);
  const std::vector<int32_t> big{65536}, neg{-1};
  EXPECT_THROW(w.add_document(big.data(), 1), std::invalid_argument);
  EXPECT_THROW(w.add_document(neg.data(), 1), std::invalid_argument);
  EXPECT_THROW(IndexedDatasetWriter(path("x"), 8), std::invalid_argument);
  const InputError e = expect_input_error([&] { IndexedDatasetWriter(path("no/such/dir/x"), 2); });
  EXPECT_EQ(e.file(), path("no/such/dir/x") + ".bin");
}

TEST_F(Formats, IndexedReadsSeveralSequencesPerDocumentAsOne) {
  // Document 0 = sequences 0..2 (sentence-split), document 1 = sequence 3, document 2 = none.
  const std::vector<int32_t> lengths{2, 0, 3, 1};
  const std::string prefix = dataset("multi", encode_idx(8, lengths, {0, 4, 4, 10}, {0, 3, 4, 4}),
                                     encode_tokens<uint16_t>({{1, 2, 3, 4, 5, 6}}));
  const auto c = open_indexed_dataset(prefix);
  expect_documents(*c, {{1, 2, 3, 4, 5}, {6}, {}});
  std::vector<int32_t> out(3);
  c->read(0, 1, 3, out.data());  // across the empty sequence
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(c->locate(0, 2), prefix + ".bin: byte 4");
  EXPECT_EQ(c->locate(1, 0), prefix + ".bin: byte 10");
}

TEST_F(Formats, IndexedAcceptsUint8AndInt64) {
  const Docs docs{{1, 255}, {0}};
  const auto u8 =
      open_indexed_dataset(dataset("u8", encode_idx(1, 1, docs), encode_tokens<uint8_t>(docs)));
  EXPECT_EQ(u8->token_bytes(), 1);
  expect_documents(*u8, docs);
  const Docs wide{{1, 2147483647}, {3}};
  const auto i64 =
      open_indexed_dataset(dataset("i64", encode_idx(5, 8, wide), encode_tokens<int64_t>(wide)));
  EXPECT_EQ(i64->token_bytes(), 8);
  expect_documents(*i64, wide);
  // A token beyond int32 is named by its byte when read.
  std::string bin = encode_tokens<int64_t>(wide);
  poke<int64_t>(&bin, 8, int64_t{1} << 33);
  const auto bad = open_indexed_dataset(dataset("i64bad", encode_idx(5, 8, wide), bin));
  std::vector<int32_t> out(2);
  const InputError e = expect_input_error([&] { bad->read(0, 0, 2, out.data()); });
  EXPECT_EQ(e.file(), path("i64bad") + ".bin");
  EXPECT_EQ(e.where(), "byte 8");
  EXPECT_TRUE(contains(e.expected(), "fits int32, found 8589934592")) << e.what();
}

// ---- Megatron indexed dataset: bad input ----

class IndexedBad : public Formats {
 protected:
  // A valid uint16 dataset of three documents: lengths at byte 34, pointers at 46, document
  // indices at 70 (4 entries), 102 bytes in all; .bin 12 bytes.
  Docs docs_{{1, 2, 3}, {4}, {5, 6}};
  std::string idx_ = encode_idx(8, 2, docs_);
  std::string bin_ = encode_tokens<uint16_t>(docs_);

  InputError open_error(const std::string& idx, const std::string& bin) {
    const std::string prefix = dataset("bad", idx, bin);
    return expect_input_error([&] { open_indexed_dataset(prefix); });
  }
  std::string idx_path() const { return path("bad") + ".idx"; }
  std::string bin_path() const { return path("bad") + ".bin"; }
};

TEST_F(IndexedBad, ValidBaselineOpens) {
  ASSERT_EQ(idx_.size(), 102u);
  const auto c = open_indexed_dataset(dataset("bad", idx_, bin_));
  expect_documents(*c, docs_);
}

TEST_F(IndexedBad, MissingFilesAreNamed) {
  InputError e = expect_input_error([&] { open_indexed_dataset(path("none")); });
  EXPECT_EQ(e.file(), path("none") + ".idx");
  EXPECT_TRUE(contains(e.expected(), "an existing file")) << e.what();
  write_bytes(path("half.idx"), idx_);
  e = expect_input_error([&] { open_indexed_dataset(path("half")); });
  EXPECT_EQ(e.file(), path("half") + ".bin");
  EXPECT_TRUE(contains(e.expected(), "No such file")) << e.what();
}

TEST_F(IndexedBad, TruncatedIndex) {
  InputError e = open_error(idx_.substr(0, 20), bin_);
  EXPECT_EQ(e.file(), idx_path());
  EXPECT_EQ(e.where(), "byte 20");
  EXPECT_TRUE(contains(e.expected(), "a header of 34 bytes")) << e.what();
  e = open_error(idx_.substr(0, 101), bin_);
  EXPECT_EQ(e.where(), "byte 101");
  EXPECT_TRUE(contains(e.expected(), "3 sequences: 12 bytes each, 4 document indices")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "102 bytes in all")) << e.what();
  // A count no file could hold.
  std::string huge = idx_;
  poke<uint64_t>(&huge, 18, uint64_t{1} << 62);
  e = open_error(huge, bin_);
  EXPECT_EQ(e.where(), "byte 102");
  e = open_error(idx_ + "xy", bin_);
  EXPECT_EQ(e.where(), "byte 102");
  EXPECT_TRUE(contains(e.expected(), "found 2 more bytes")) << e.what();
  // Three trailing bytes are a multimodal dataset's sequence modes: accepted.
  open_indexed_dataset(dataset("modes", idx_ + std::string(3, '\0'), bin_));
}

TEST_F(IndexedBad, MagicVersionDtype) {
  std::string s = idx_;
  s[3] = 'X';
  InputError e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 0");
  EXPECT_TRUE(contains(e.expected(), "magic MMIDIDX")) << e.what();
  s = idx_;
  poke<uint64_t>(&s, 9, 2);
  e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 9");
  EXPECT_EQ(e.expected(), "version 1, found 2");
  s = idx_;
  s[17] = 9;
  e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 17");
  EXPECT_TRUE(contains(e.expected(), "dtype code in 1..8, found 9")) << e.what();
  for (uint8_t code : {2, 3, 6, 7}) {
    s = idx_;
    s[17] = static_cast<char>(code);
    e = open_error(s, bin_);
    EXPECT_EQ(e.where(), "byte 17");
    EXPECT_TRUE(contains(e.expected(), "an integer token dtype")) << e.what();
  }
  s[17] = 7;
  EXPECT_TRUE(contains(open_error(s, bin_).expected(), "found float32 (7)"));
}

TEST_F(IndexedBad, BinSizeDisagrees) {
  InputError e = open_error(idx_, bin_.substr(0, 10));
  EXPECT_EQ(e.file(), bin_path());
  EXPECT_EQ(e.where(), "byte 10");
  EXPECT_TRUE(contains(e.expected(), "at least 12 bytes (sequence 2")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "2 bytes short")) << e.what();
  e = open_error(idx_, bin_ + "ab");
  EXPECT_EQ(e.file(), bin_path());
  EXPECT_EQ(e.where(), "byte 12");
  EXPECT_TRUE(contains(e.expected(), "after the 6 uint16 tokens")) << e.what();
  // The index says uint16 but the .bin was written as int32: twice the size.
  e = open_error(idx_, encode_tokens<int32_t>(docs_));
  EXPECT_TRUE(contains(e.expected(), "its size fits int32 tokens")) << e.what();
  // ... or int32 while the .bin holds uint16: the pointers of int32 run past it.
  e = open_error(encode_idx(4, 4, docs_), bin_);
  EXPECT_EQ(e.file(), bin_path());
  EXPECT_TRUE(contains(e.expected(), "bytes short")) << e.what();
}

TEST_F(IndexedBad, PointersAndLengths) {
  std::string s = idx_;
  poke<int32_t>(&s, 34 + 4, -1);
  InputError e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 38");
  EXPECT_TRUE(contains(e.expected(), "non-negative length of sequence 1, found -1")) << e.what();
  s = idx_;
  poke<int64_t>(&s, 46 + 8, 2);  // sequence 1 starts inside sequence 0
  e = open_error(s, bin_);
  EXPECT_EQ(e.file(), idx_path());
  EXPECT_EQ(e.where(), "byte 54");
  EXPECT_TRUE(contains(e.expected(), "ascending pointers")) << e.what();
  s = idx_;
  poke<int64_t>(&s, 46 + 16, 1000);
  e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 62");
  EXPECT_TRUE(contains(e.expected(), "within " + bin_path() + " (12 bytes), found 1000"))
      << e.what();
  s = idx_;
  poke<int64_t>(&s, 46 + 16, -2);
  EXPECT_EQ(open_error(s, bin_).where(), "byte 62");
  s = idx_;
  poke<int64_t>(&s, 46 + 16, 9);
  e = open_error(s, bin_);
  EXPECT_TRUE(contains(e.expected(), "a multiple of 2 bytes (uint16 tokens), found 9")) << e.what();
}

TEST_F(IndexedBad, DocumentIndices) {
  std::string s = idx_;
  poke<int64_t>(&s, 70, 1);
  InputError e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 70");
  EXPECT_TRUE(contains(e.expected(), "document index 0 to be 0, found 1")) << e.what();
  s = idx_;
  poke<int64_t>(&s, 70 + 16, 0);
  e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 86");
  EXPECT_TRUE(contains(e.expected(), "ascending")) << e.what();
  s = idx_;
  poke<int64_t>(&s, 70 + 24, 2);
  e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 94");
  s = idx_;
  poke<int64_t>(&s, 70 + 24, 4);
  e = open_error(s, bin_);
  EXPECT_EQ(e.where(), "byte 94");
  s = idx_;
  poke<uint64_t>(&s, 26, 0);
  e = open_error(s.substr(0, 70), bin_);
  EXPECT_EQ(e.where(), "byte 26");
}

TEST_F(IndexedBad, EmptyDataset) {
  {
    IndexedDatasetWriter w(path("none"), 2);
    w.finish();
  }
  InputError e = expect_input_error([&] { open_indexed_dataset(path("none")); });
  EXPECT_EQ(e.file(), path("none") + ".idx");
  EXPECT_TRUE(contains(e.expected(), "at least one document, the index has none")) << e.what();
  {
    IndexedDatasetWriter w(path("empties"), 2);
    w.add_document(nullptr, 0);
    w.add_document(nullptr, 0);
    w.finish();
  }
  e = expect_input_error([&] { open_indexed_dataset(path("empties")); });
  EXPECT_TRUE(contains(e.expected(), "at least one token, its 2 documents are all empty"))
      << e.what();
}

// ---- Megatron-Core compatibility (fixtures from tests/golden/megatron/) ----

TEST(MegatronCompat, ReadsMegatronCoreUint16) {
  const Docs docs = load_json_documents(kGolden + "mc_uint16.json");
  ASSERT_EQ(docs.size(), 300u);
  const auto c = open_indexed_dataset(kGolden + "mc_uint16");
  EXPECT_EQ(c->token_bytes(), 2);
  expect_documents(*c, docs);
  // Megatron writes the documents back to back: token k of document d is at byte 2 (tokens
  // before d + k).
  int64_t before = 0;
  for (int d = 0; d < 10; ++d) before += static_cast<int64_t>(docs[d].size());
  ASSERT_GT(docs[10].size(), 1u);
  EXPECT_EQ(c->locate(10, 1), kGolden + "mc_uint16.bin: byte " + std::to_string(2 * (before + 1)));
}

TEST(MegatronCompat, ReadsMegatronCoreInt32WithSplitDocuments) {
  std::ifstream in(kGolden + "mc_int32.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  const Docs docs = j.at("documents").get<Docs>();
  const auto seqs = j.at("sequence_lengths").get<std::vector<std::vector<int64_t>>>();
  const auto c = open_indexed_dataset(kGolden + "mc_int32");
  EXPECT_EQ(c->token_bytes(), 4);
  expect_documents(*c, docs);
  // Some documents have several sequences, some tokens are above uint16.
  int split = 0;
  bool wide = false;
  int64_t before = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    for (int32_t t : docs[d]) wide = wide || t > 65535;
    if (seqs[d].size() > 1) {
      ++split;
      // The last token of a split document, in its last sequence.
      const int64_t k = static_cast<int64_t>(docs[d].size()) - 1;
      EXPECT_EQ(c->locate(static_cast<int64_t>(d), k),
                kGolden + "mc_int32.bin: byte " + std::to_string(4 * (before + k)));
    }
    before += static_cast<int64_t>(docs[d].size());
  }
  EXPECT_GT(split, 10);
  EXPECT_TRUE(wide);
}

// Strata's writer over mc_uint16's documents must give strata_written.{idx,bin}, which
// make_megatron_fixtures.py reads with megatron-core — and which equal megatron-core's own
// mc_uint16 bytes. STRATA_UPDATE_GOLDEN=1 (re)writes strata_written into the source tree.
TEST_F(Formats, MegatronCompatStrataWrittenMatchesGolden) {
  const Docs docs = load_json_documents(kGolden + "mc_uint16.json");
  const char* update = std::getenv("STRATA_UPDATE_GOLDEN");
  const std::string prefix =
      update != nullptr && std::string(update) == "1" ? kGolden + "strata_written" : path("sw");
  IndexedDatasetWriter w(prefix, optimal_token_bytes(65500 - 1));
  for (const auto& d : docs) w.add_document(d.data(), static_cast<int64_t>(d.size()));
  w.finish();
  for (const char* ext : {".idx", ".bin"}) {
    const std::string got = read_bytes(prefix + ext);
    EXPECT_EQ(got, read_bytes(kGolden + "strata_written" + ext)) << ext;
    EXPECT_EQ(got, read_bytes(kGolden + "mc_uint16" + ext)) << ext;
  }
}

// ---- llm.c token shards ----

// A shard as llm.c's write_datafile lays it out.
std::string encode_shard(int32_t magic, int32_t version, const std::vector<int32_t>& tokens,
                         int width) {
  std::string s;
  put(&s, magic);
  put(&s, version);
  put(&s, static_cast<int32_t>(tokens.size()));
  s.resize(1024, '\0');
  for (int32_t t : tokens) {
    if (width == 2) {
      put(&s, static_cast<uint16_t>(t));
    } else {
      put(&s, static_cast<uint32_t>(t));
    }
  }
  return s;
}

std::vector<int32_t> iota_tokens(int n, int32_t start, int32_t mod) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (start + i) % mod;
  return t;
}

TEST_F(Formats, ShardWriterBytesAreLlmcsLayout) {
  const std::vector<int32_t> t{0, 1, 50256, 65535};
  write_token_shard(path("a.bin"), t.data(), 4, 2);
  EXPECT_EQ(read_bytes(path("a.bin")), encode_shard(20240520, 1, t, 2));
  const std::vector<int32_t> u{0, 128255, 2147483647};
  write_token_shard(path("b.bin"), u.data(), 3, 4);
  EXPECT_EQ(read_bytes(path("b.bin")), encode_shard(20240801, 7, u, 4));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
  const std::vector<int32_t> big{65536};
  EXPECT_THROW(write_token_shard(path("c.bin"), big.data(), 1, 2), std::invalid_argument);
  EXPECT_THROW(write_token_shard(path("c.bin"), t.data(), 4, 8), std::invalid_argument);
  EXPECT_FALSE(fs::exists(path("c.bin")));
}

TEST_F(Formats, ShardsRoundTripChunkedIntoDocuments) {
  for (int width : {2, 4}) {
    const std::vector<int32_t> t = iota_tokens(2500, 7, width == 2 ? 65536 : 1 << 30);
    const std::string p = path("s" + std::to_string(width) + ".bin");
    write_token_shard(p, t.data(), 2500, width);
    const auto c = open_token_shards(p, 1000);
    EXPECT_EQ(c->path(), p);
    EXPECT_EQ(c->token_bytes(), width);
    expect_documents(*c, {std::vector<int32_t>(t.begin(), t.begin() + 1000),
                          std::vector<int32_t>(t.begin() + 1000, t.begin() + 2000),
                          std::vector<int32_t>(t.begin() + 2000, t.end())});
    EXPECT_EQ(c->locate(2, 10), p + ": byte " + std::to_string(1024 + (2010) * width));
    // The default: 2^20 tokens per document, so this shard is one document.
    EXPECT_EQ(open_token_shards(p)->num_documents(), 1);
  }
}

TEST_F(Formats, ShardsGlobSortedAcrossFiles) {
  // Written out of order; an empty shard in the middle owns no document.
  const auto a = iota_tokens(5, 0, 100), b = iota_tokens(3, 50, 100);
  write_token_shard(path("train_000002.bin"), b.data(), 3, 2);
  write_token_shard(path("train_000001.bin"), nullptr, 0, 2);
  write_token_shard(path("train_000000.bin"), a.data(), 5, 2);
  write_bytes(path("other.bin"), "not a shard");
  const std::string pattern = path("train_*.bin");
  const auto c = open_token_shards(pattern, 4);
  EXPECT_EQ(c->path(), pattern);
  expect_documents(*c, {{0, 1, 2, 3}, {4}, {50, 51, 52}});
  EXPECT_EQ(c->locate(1, 0), path("train_000000.bin") + ": byte " + std::to_string(1024 + 8));
  EXPECT_EQ(c->locate(2, 2), path("train_000002.bin") + ": byte " + std::to_string(1024 + 4));
}

TEST_F(Formats, ShardsBadInput) {
  const std::vector<int32_t> t = iota_tokens(10, 0, 1000);
  const std::string good = encode_shard(20240520, 1, t, 2);
  auto error = [&](const std::string& bytes) {
    write_bytes(path("x.bin"), bytes);
    return expect_input_error([&] { open_token_shards(path("x.bin")); });
  };
  InputError e = expect_input_error([&] { open_token_shards(path("nope.bin")); });
  EXPECT_EQ(e.file(), path("nope.bin"));
  e = expect_input_error([&] { open_token_shards(path("nope_*.bin")); });
  EXPECT_EQ(e.file(), path("nope_*.bin"));
  EXPECT_TRUE(contains(e.expected(), "at least one file matching the pattern")) << e.what();
  e = error(good.substr(0, 100));
  EXPECT_EQ(e.file(), path("x.bin"));
  EXPECT_EQ(e.where(), "byte 100");
  EXPECT_TRUE(contains(e.expected(), "a header of 256 int32")) << e.what();
  e = error(encode_shard(1234, 1, t, 2));
  EXPECT_EQ(e.where(), "byte 0");
  EXPECT_TRUE(contains(e.expected(), "found 1234")) << e.what();
  e = error(encode_shard(20240520, 7, t, 2));
  EXPECT_EQ(e.where(), "byte 4");
  EXPECT_TRUE(contains(e.expected(), "version 1 (magic 20240520, uint16 tokens), found 7"));
  e = error(encode_shard(20240801, 1, t, 4));
  EXPECT_EQ(e.where(), "byte 4");
  std::string s = good;
  poke<int32_t>(&s, 8, -5);
  e = error(s);
  EXPECT_EQ(e.where(), "byte 8");
  s = good;
  poke<int32_t>(&s, 8, 11);
  e = error(s);
  EXPECT_EQ(e.where(), "byte 1044");
  EXPECT_TRUE(contains(e.expected(), "1046 bytes (header + 11 uint16 tokens)")) << e.what();
  EXPECT_TRUE(contains(e.expected(), "2 bytes short")) << e.what();
  s = good;
  poke<int32_t>(&s, 8, 9);
  e = error(s);
  EXPECT_EQ(e.where(), "byte 1042");
  EXPECT_TRUE(contains(e.expected(), "found 2 more bytes")) << e.what();
  e = error(encode_shard(20240520, 1, {}, 2));
  EXPECT_TRUE(contains(e.expected(), "at least one token")) << e.what();
  // Shards of different token sizes in one corpus.
  write_bytes(path("m_0.bin"), good);
  write_bytes(path("m_1.bin"), encode_shard(20240801, 7, t, 4));
  e = expect_input_error([&] { open_token_shards(path("m_*.bin")); });
  EXPECT_EQ(e.file(), path("m_1.bin"));
  EXPECT_TRUE(contains(e.expected(), "one corpus has one token size")) << e.what();
  // A uint32 token beyond int32 is named by its byte when read.
  write_bytes(path("w.bin"), encode_shard(20240801, 7, {1, -2}, 4));  // -2 = 4294967294
  const auto c = open_token_shards(path("w.bin"));
  std::vector<int32_t> out(2);
  e = expect_input_error([&] { c->read(0, 0, 2, out.data()); });
  EXPECT_EQ(e.file(), path("w.bin"));
  EXPECT_EQ(e.where(), "byte 1028");
  EXPECT_TRUE(contains(e.expected(), "found 4294967294")) << e.what();
}

// ---- Mapping, not copying ----

int64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

bool mapped_in_process(const std::string& file) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    if (contains(line, file)) return true;
  }
  return false;
}

// A 100 MB .bin (50 documents of 2^20 uint16 tokens) opened and one document read: resident
// memory grows by about that document (2 MiB mapped + 4 MiB widened), not by the file.
TEST_F(Formats, IndexedMapsTheBinInsteadOfReadingIt) {
  constexpr int kDocs = 50;
  constexpr int kTokens = 1 << 20;
  const std::string prefix = path("big");
  {
    std::vector<int32_t> doc(kTokens);
    IndexedDatasetWriter w(prefix, 2);
    for (int d = 0; d < kDocs; ++d) {
      for (int i = 0; i < kTokens; ++i) doc[i] = (d + i) % 50000;
      w.add_document(doc.data(), kTokens);
    }
    w.finish();
  }
  ASSERT_EQ(fs::file_size(prefix + ".bin"), uint64_t{2} * kDocs * kTokens);
  std::vector<int32_t> out(kTokens);  // touched now, so it is in the baseline
  std::fill(out.begin(), out.end(), -1);
  const int64_t before = rss_kib();
  const auto c = open_indexed_dataset(prefix);
  EXPECT_TRUE(mapped_in_process(prefix + ".bin"));
  c->read(37, 0, kTokens, out.data());
  const int64_t grown = rss_kib() - before;
  EXPECT_EQ(out[0], 37);
  EXPECT_EQ(out[kTokens - 1], (37 + kTokens - 1) % 50000);
  EXPECT_EQ(c->num_tokens(), int64_t{kDocs} * kTokens);
  EXPECT_LT(grown, 16 * 1024) << "VmRSS grew by " << grown << " KiB for a 100 MiB file";
}

}  // namespace
}  // namespace strata
