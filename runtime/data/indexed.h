// indexed.h — Megatron-LM's indexed dataset (PREFIX.idx + PREFIX.bin), read and written
// byte-compatibly with Megatron-Core's IndexedDataset / IndexedDatasetBuilder
// (megatron/core/datasets/indexed_dataset.py).
//
// PREFIX.bin is the tokens of every sequence, back to back, in the index's dtype. PREFIX.idx,
// little-endian:
//   byte 0   magic "MMIDIDX\0\0" (9 bytes)
//   byte 9   version, uint64 = 1
//   byte 17  dtype code, uint8 (Megatron's DType: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//            6 float64, 7 float32, 8 uint16)
//   byte 18  S = sequence count, uint64
//   byte 26  D = document index entries, uint64 (documents + 1: Megatron writes the length of
//            its document_indices list, which starts with 0)
//   byte 34  sequence lengths, int32[S] (tokens)
//            sequence pointers, int64[S] (byte offsets into .bin)
//            document indices, int64[D] (document i is sequences [doc[i], doc[i+1]);
//            doc[0] = 0, doc[D-1] = S)
//   (a multimodal dataset appends sequence modes, int8[S]; accepted and ignored)
//
// Documents. A Strata document is a Megatron document: the sequences doc[i] .. doc[i+1]-1,
// concatenated in order. Megatron's GPT data (tools/preprocess_data.py without
// --split-sentences) has exactly one sequence per document, so there the two coincide; with
// sentence splitting a document's sentences are joined back into one run of tokens (the GPT
// dataset concatenates documents anyway; Megatron's GPTDataset instead samples by sequence).
// A document may be empty (0 tokens, or 0 sequences).
//
// Token dtypes read: uint16 and int32 (what Megatron writes, DType.optimal_dtype), and uint8
// and int64; all are widened to int32 by read(), and an int64 token outside int32 is an
// InputError naming its byte. int8, int16 and the float dtypes are refused at open.
//
// open_indexed_dataset validates the whole index at open (one pass over S sequences and D
// entries, nothing kept but a prefix sum of document lengths, 8 bytes per document): every
// error below is an InputError naming the file and the byte offset:
//   missing .idx or .bin; .idx shorter than its header or than the arrays its counts announce,
//   or longer (other than the modes); magic, version or dtype code wrong; a negative length;
//   a pointer not a multiple of the token size, before the end of the previous sequence, or
//   beyond the .bin; a .bin shorter than the last sequence's end, or longer (reported with
//   the dtype its size would fit: a .bin written with another dtype than the index says);
//   document indices not starting at 0, decreasing, or not ending at S; 0 documents or 0 tokens.
//
// Thread-safety: the corpus is immutable after open; its const methods may run concurrently.
// A writer belongs to one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/binary_io.h"
#include "runtime/data/corpus.h"

namespace strata {

// Bytes per token Megatron chooses for a vocabulary (DType.optimal_dtype): 2 (uint16) when
// vocab_size < 65500, else 4 (int32). Megatron's bound is 65500, not 65536; followed exactly so
// that both tools pick the same dtype for the same tokenizer.
int optimal_token_bytes(int64_t vocab_size);

// Opens PREFIX.idx and PREFIX.bin (both memory-mapped). path() is the prefix; locate() names
// PREFIX.bin. Throws InputError (above).
std::unique_ptr<TokenCorpus> open_indexed_dataset(const std::string& prefix);

// Writes PREFIX.bin and PREFIX.idx as Megatron-Core's IndexedDatasetBuilder does with one
// sequence per document (add_document(tokens, [len]) for each, then finalize): the same bytes
// for the same documents and dtype. token_bytes is 2 (uint16) or 4 (int32), usually
// optimal_token_bytes(vocab). Both files are written under temporary names and renamed into
// place by finish() (.bin first, then .idx), so an existing dataset of that prefix is replaced
// only by a complete one; a writer destroyed before finish() leaves no file behind.
// Only the sequence lengths (4 bytes per document) are held in memory.
class IndexedDatasetWriter {
 public:
  // Throws std::invalid_argument for token_bytes other than 2 or 4, InputError when a file
  // cannot be created.
  IndexedDatasetWriter(std::string prefix, int token_bytes);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document of n tokens (n may be 0). Throws std::invalid_argument when a token
  // does not fit the dtype (uint16: 0..65535; int32: non-negative) or n exceeds INT32_MAX
  // (Megatron's lengths are int32), std::logic_error after finish().
  void add_document(const int32_t* tokens, int64_t n);
  // Writes the index and puts both files in place. Throws InputError on write errors,
  // std::logic_error when called twice.
  void finish();

  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::string prefix_;
  int token_bytes_;
  std::unique_ptr<binary_io::AtomicFile> bin_;
  std::vector<int32_t> lengths_;  // [document] tokens
  std::vector<uint8_t> buffer_;   // one document converted to the dtype
  int64_t num_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace strata
