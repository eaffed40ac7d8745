// indexed.cc — Megatron's MMIDIDX indexed dataset: the reader (validated at open, tokens read
// in place from the mapped .bin) and the writer.
#include "runtime/data/indexed.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "runtime/base/error.h"
#include "runtime/data/mmap_file.h"

namespace strata {
namespace {

using binary_io::byte_at;
using binary_io::load;

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 34;  // magic 9, version 8, dtype 1, two counts 8 + 8

// Megatron-Core's DType codes.
enum class DType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

const char* dtype_name(uint8_t code) {
  static const char* const names[] = {"",      "uint8",   "int8",    "int16", "int32",
                                      "int64", "float64", "float32", "uint16"};
  return code >= 1 && code <= 8 ? names[code] : "unknown";
}

int dtype_bytes(uint8_t code) {
  static const int sizes[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  return code >= 1 && code <= 8 ? sizes[code] : 0;
}

class IndexedCorpus final : public TokenCorpus {
 public:
  explicit IndexedCorpus(const std::string& prefix);

  std::string path() const override { return prefix_; }
  int64_t num_documents() const override { return static_cast<int64_t>(doc_start_.size()) - 1; }
  int64_t document_length(int64_t d) const override {
    check_document(d);
    return doc_start_[d + 1] - doc_start_[d];
  }
  int64_t num_tokens() const override { return doc_start_.back(); }
  int token_bytes() const override { return token_bytes_; }
  void read(int64_t d, int64_t offset, int64_t count, int32_t* out) const override;
  std::string locate(int64_t d, int64_t offset) const override;

 private:
  int64_t length(int64_t s) const {
    return load<int32_t>(idx_.data() + lengths_at_ + 4 * static_cast<uint64_t>(s));
  }
  int64_t pointer(int64_t s) const {
    return load<int64_t>(idx_.data() + pointers_at_ + 8 * static_cast<uint64_t>(s));
  }
  int64_t first_sequence(int64_t d) const {
    return load<int64_t>(idx_.data() + documents_at_ + 8 * static_cast<uint64_t>(d));
  }
  void check_document(int64_t d) const {
    if (d < 0 || d >= num_documents()) {
      throw std::out_of_range(prefix_ + ": document " + std::to_string(d) + " of " +
                              std::to_string(num_documents()));
    }
  }
  // The sequence of document d holding token `offset`, and the offset within it.
  std::pair<int64_t, int64_t> find(int64_t d, int64_t offset) const;
  void validate_sequences();
  void validate_documents(uint64_t entries);

  std::string prefix_, idx_path_, bin_path_;
  MappedFile idx_, bin_;
  uint8_t dtype_ = 0;
  int token_bytes_ = 0;
  int64_t sequences_ = 0;
  uint64_t lengths_at_ = 0, pointers_at_ = 0, documents_at_ = 0;  // byte offsets in .idx
  std::vector<int64_t> doc_start_;  // [document + 1] first token of each document, then total
};

IndexedCorpus::IndexedCorpus(const std::string& prefix)
    : prefix_(prefix), idx_path_(prefix + ".idx"), bin_path_(prefix + ".bin") {
  idx_ = MappedFile::open(idx_path_, MappedFile::Access::kWillNeed);
  const uint8_t* h = idx_.data();
  const uint64_t size = idx_.size();
  if (size < kHeaderBytes) {
    throw InputError(idx_path_, byte_at(size),
                     "a header of 34 bytes (magic MMIDIDX\\x00\\x00, version, dtype code, "
                     "sequence and document counts), the index ends after " +
                         std::to_string(size) + " bytes");
  }
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    throw InputError(idx_path_, byte_at(0),
                     "magic MMIDIDX\\x00\\x00 (a Megatron indexed dataset index)");
  }
  const uint64_t version = load<uint64_t>(h + 9);
  if (version != kVersion) {
    throw InputError(idx_path_, byte_at(9), "version 1, found " + std::to_string(version));
  }
  dtype_ = h[17];
  token_bytes_ = dtype_bytes(dtype_);
  if (token_bytes_ == 0) {
    throw InputError(idx_path_, byte_at(17),
                     "a Megatron dtype code in 1..8, found " + std::to_string(dtype_));
  }
  const DType t = static_cast<DType>(dtype_);
  if (t != DType::kUInt8 && t != DType::kUInt16 && t != DType::kInt32 && t != DType::kInt64) {
    throw InputError(idx_path_, byte_at(17),
                     std::string("an integer token dtype (uint16 = 8, int32 = 4, uint8 = 1, "
                                 "int64 = 5), found ") +
                         dtype_name(dtype_) + " (" + std::to_string(dtype_) + ")");
  }
  const uint64_t sequences = load<uint64_t>(h + 18);
  const uint64_t entries = load<uint64_t>(h + 26);
  // Each count is bounded by the file size before anything multiplies it (no overflow).
  const uint64_t available = size - kHeaderBytes;
  if (sequences > available / 12 || entries > available / 8 ||
      12 * sequences + 8 * entries > available) {
    const bool huge = sequences > available / 12 || entries > available / 8;
    throw InputError(
        idx_path_, byte_at(size),
        "the arrays the header announces (" + std::to_string(sequences) +
            " sequences: 12 bytes each, " + std::to_string(entries) +
            " document indices: 8 bytes each" +
            (huge ? ")"
                  : ", " + std::to_string(kHeaderBytes + 12 * sequences + 8 * entries) +
                        " bytes in all)") +
            ", the index ends after " + std::to_string(size) + " bytes");
  }
  sequences_ = static_cast<int64_t>(sequences);
  lengths_at_ = kHeaderBytes;
  pointers_at_ = lengths_at_ + 4 * sequences;
  documents_at_ = pointers_at_ + 8 * sequences;
  const uint64_t end = documents_at_ + 8 * entries;
  if (size != end && size != end + sequences) {
    throw InputError(idx_path_, byte_at(end),
                     "the end of the index after the " + std::to_string(entries) +
                         " document indices (or " + std::to_string(sequences) +
                         " sequence modes), found " + std::to_string(size - end) + " more bytes");
  }
  bin_ = MappedFile::open(bin_path_, MappedFile::Access::kNormal);
  validate_sequences();
  validate_documents(entries);
}

void IndexedCorpus::validate_sequences() {
  const uint64_t bin_size = bin_.size();
  const uint64_t width = static_cast<uint64_t>(token_bytes_);
  uint64_t end = 0;  // byte in .bin where the previous sequence ends
  for (int64_t s = 0; s < sequences_; ++s) {
    const uint64_t s64 = static_cast<uint64_t>(s);
    const int64_t len = length(s);
    if (len < 0) {
      throw InputError(idx_path_, byte_at(lengths_at_ + 4 * s64),
                       "a non-negative length of sequence " + std::to_string(s) + ", found " +
                           std::to_string(len));
    }
    const int64_t ptr = pointer(s);
    const std::string where = byte_at(pointers_at_ + 8 * s64);
    const std::string what = "pointer of sequence " + std::to_string(s);
    if (ptr < 0 || static_cast<uint64_t>(ptr) > bin_size) {
      throw InputError(idx_path_, where,
                       "a " + what + " within " + bin_path_ + " (" + std::to_string(bin_size) +
                           " bytes), found " + std::to_string(ptr));
    }
    const uint64_t p = static_cast<uint64_t>(ptr);
    if (p % width != 0) {
      throw InputError(idx_path_, where,
                       "a " + what + " that is a multiple of " + std::to_string(width) +
                           " bytes (" + dtype_name(dtype_) + " tokens), found " +
                           std::to_string(ptr));
    }
    if (p < end) {
      throw InputError(idx_path_, where,
                       "ascending pointers: the " + what + " at or after byte " +
                           std::to_string(end) + " of " + bin_path_ + " (the end of sequence " +
                           std::to_string(s - 1) + "), found " + std::to_string(ptr));
    }
    end = p + static_cast<uint64_t>(len) * width;
    if (end > bin_size) {
      throw InputError(bin_path_, byte_at(bin_size),
                       "at least " + std::to_string(end) + " bytes (sequence " + std::to_string(s) +
                           " of " + idx_path_ + ": " + std::to_string(len) + " " +
                           dtype_name(dtype_) + " tokens from byte " + std::to_string(ptr) +
                           "), the file ends here, " + std::to_string(end - bin_size) +
                           " bytes short");
    }
  }
  if (bin_size > end) {
    std::string hint;
    for (uint8_t code : {1, 8, 4, 5}) {
      if (code != dtype_ && end % width == 0 &&
          bin_size * width == end * static_cast<uint64_t>(dtype_bytes(code))) {
        hint = "; its size fits " + std::string(dtype_name(code)) +
               " tokens: was it written with another dtype than the index says?";
      }
    }
    throw InputError(bin_path_, byte_at(end),
                     "the end of the data after the " + std::to_string(end / width) + " " +
                         dtype_name(dtype_) + " tokens " + idx_path_ + " describes, found " +
                         std::to_string(bin_size - end) + " more bytes" + hint);
  }
}

void IndexedCorpus::validate_documents(uint64_t entries) {
  if (entries == 0) {
    throw InputError(idx_path_, byte_at(26),
                     "at least one document index (the list starts with 0), found 0");
  }
  doc_start_.resize(entries);
  int64_t tokens = 0;
  int64_t prev = 0;
  for (uint64_t i = 0; i < entries; ++i) {
    const int64_t first = first_sequence(static_cast<int64_t>(i));
    const std::string where = byte_at(documents_at_ + 8 * i);
    if (i == 0 && first != 0) {
      throw InputError(idx_path_, where,
                       "document index 0 to be 0, found " + std::to_string(first));
    }
    if (first < prev || first > sequences_) {
      throw InputError(idx_path_, where,
                       "document index " + std::to_string(i) + " in [" + std::to_string(prev) +
                           ", " + std::to_string(sequences_) + "] (ascending, at most the " +
                           "sequence count), found " + std::to_string(first));
    }
    for (int64_t s = prev; s < first; ++s) tokens += length(s);
    doc_start_[i] = tokens;
    prev = first;
  }
  if (prev != sequences_) {
    throw InputError(idx_path_, byte_at(documents_at_ + 8 * (entries - 1)),
                     "the last document index to be the sequence count " +
                         std::to_string(sequences_) + ", found " + std::to_string(prev));
  }
  if (entries == 1) {
    throw InputError(idx_path_, byte_at(26),
                     "a dataset with at least one document, the index has none");
  }
  if (tokens == 0) {
    throw InputError(idx_path_, "",
                     "a dataset with at least one token, its " + std::to_string(entries - 1) +
                         " documents are all empty");
  }
}

std::pair<int64_t, int64_t> IndexedCorpus::find(int64_t d, int64_t offset) const {
  // Documents of one sequence (Megatron's GPT data) stop at once; sentence-split documents
  // walk their few sequences.
  int64_t s = first_sequence(d);
  while (offset >= length(s) && s + 1 < first_sequence(d + 1)) {
    offset -= length(s);
    ++s;
  }
  return {s, offset};
}

void IndexedCorpus::read(int64_t d, int64_t offset, int64_t count, int32_t* out) const {
  check_document(d);
  const int64_t len = doc_start_[d + 1] - doc_start_[d];
  if (offset < 0 || count < 0 || offset > len || count > len - offset) {
    throw std::out_of_range(prefix_ + ": tokens [" + std::to_string(offset) + ", " +
                            std::to_string(offset + count) + ") of document " + std::to_string(d) +
                            " of " + std::to_string(len) + " tokens");
  }
  if (count == 0) return;
  auto [s, at] = find(d, offset);
  while (count > 0) {
    const int64_t n = std::min(count, length(s) - at);
    const uint64_t byte =
        static_cast<uint64_t>(pointer(s)) + static_cast<uint64_t>(at) * token_bytes_;
    const uint8_t* src = bin_.data() + byte;
    int64_t fit = n;
    switch (static_cast<DType>(dtype_)) {
      case DType::kUInt8:
        fit = binary_io::widen<uint8_t>(src, n, out);
        break;
      case DType::kUInt16:
        fit = binary_io::widen<uint16_t>(src, n, out);
        break;
      case DType::kInt32:
        std::memcpy(out, src, static_cast<size_t>(n) * 4);
        break;
      default:
        fit = binary_io::widen<int64_t>(src, n, out);
        break;
    }
    if (fit != n) {
      const uint64_t bad = byte + static_cast<uint64_t>(fit) * token_bytes_;
      throw InputError(
          bin_path_, byte_at(bad),
          "a token id that fits int32, found " + std::to_string(load<int64_t>(bin_.data() + bad)));
    }
    out += n;
    count -= n;
    at = 0;
    ++s;
  }
}

std::string IndexedCorpus::locate(int64_t d, int64_t offset) const {
  check_document(d);
  if (offset < 0 || offset >= doc_start_[d + 1] - doc_start_[d]) {
    throw std::out_of_range(prefix_ + ": token " + std::to_string(offset) + " of document " +
                            std::to_string(d));
  }
  const auto [s, at] = find(d, offset);
  return bin_path_ + ": " +
         byte_at(static_cast<uint64_t>(pointer(s)) + static_cast<uint64_t>(at) * token_bytes_);
}

}  // namespace

int optimal_token_bytes(int64_t vocab_size) {
  return vocab_size < 65500 ? 2 : 4;
}

std::unique_ptr<TokenCorpus> open_indexed_dataset(const std::string& prefix) {
  return std::make_unique<IndexedCorpus>(prefix);
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, int token_bytes)
    : prefix_(std::move(prefix)), token_bytes_(token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) {
    throw std::invalid_argument(
        "IndexedDatasetWriter: token_bytes must be 2 (uint16) or 4 "
        "(int32), got " +
        std::to_string(token_bytes));
  }
  bin_ = std::make_unique<binary_io::AtomicFile>(prefix_ + ".bin");
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;

void IndexedDatasetWriter::add_document(const int32_t* tokens, int64_t n) {
  if (finished_) throw std::logic_error("IndexedDatasetWriter::add_document after finish()");
  if (n < 0 || n > INT32_MAX) {
    throw std::invalid_argument("IndexedDatasetWriter: a document of 0.." +
                                std::to_string(INT32_MAX) + " tokens, got " + std::to_string(n));
  }
  const int32_t max = token_bytes_ == 2 ? 65535 : INT32_MAX;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] > max) {
      throw std::invalid_argument(
          "IndexedDatasetWriter: token " + std::to_string(i) + " of document " +
          std::to_string(lengths_.size()) + " is " + std::to_string(tokens[i]) + ", outside " +
          (token_bytes_ == 2 ? "uint16 [0, 65535]" : "[0, 2^31) for int32"));
    }
  }
  if (token_bytes_ == 4) {
    bin_->write(tokens, static_cast<uint64_t>(n) * 4);
  } else {
    buffer_.resize(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t t = static_cast<uint16_t>(tokens[i]);
      std::memcpy(&buffer_[static_cast<size_t>(i) * 2], &t, 2);
    }
    bin_->write(buffer_.data(), buffer_.size());
  }
  lengths_.push_back(static_cast<int32_t>(n));
  num_tokens_ += n;
}

void IndexedDatasetWriter::finish() {
  if (finished_) throw std::logic_error("IndexedDatasetWriter::finish called twice");
  finished_ = true;
  const uint64_t S = lengths_.size();
  binary_io::AtomicFile idx(prefix_ + ".idx");
  const uint8_t code = static_cast<uint8_t>(token_bytes_ == 2 ? DType::kUInt16 : DType::kInt32);
  const uint64_t entries = S + 1;
  idx.write(kMagic, sizeof kMagic);
  idx.write(&kVersion, 8);
  idx.write(&code, 1);
  idx.write(&S, 8);
  idx.write(&entries, 8);
  idx.write(lengths_.data(), 4 * S);
  std::vector<int64_t> v(S);  // pointers, then document indices
  int64_t ptr = 0;
  for (uint64_t s = 0; s < S; ++s) {
    v[s] = ptr;
    ptr += static_cast<int64_t>(lengths_[s]) * token_bytes_;
  }
  idx.write(v.data(), 8 * S);
  v.resize(entries);
  for (uint64_t i = 0; i < entries; ++i) v[i] = static_cast<int64_t>(i);
  idx.write(v.data(), 8 * entries);
  bin_->close();
  idx.close();
  // Both can go in place, or neither moves (PREFIX.idx a directory left PREFIX.bin renamed).
  bin_->check_destination();
  idx.check_destination();
  bin_->rename();
  idx.rename();
}

}  // namespace strata
