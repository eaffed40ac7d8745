// corpus.h — a tokenized corpus on disk: documents of token ids, read memory-mapped.
//
// The formats (runtime/data/indexed.h: Megatron-LM's MMIDIDX .idx + .bin; runtime/data/
// token_shards.h: llm.c's token shards) open as a TokenCorpus; the GPT dataset
// (runtime/data/gpt_dataset.h) samples training sequences from one, or from a blend of several.
// Nothing here copies the token data into memory: a corpus holds its index (O(documents)) and
// maps the token file, so host memory does not grow with the corpus.
//
// Thread-safety: const methods may be called concurrently (the data loader samples on a host
// thread while the device computes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace strata {

class TokenCorpus {
 public:
  virtual ~TokenCorpus() = default;

  // The file(s) it was opened from, for messages ("data/owt_text_document", "shards/*.bin").
  virtual std::string path() const = 0;
  virtual int64_t num_documents() const = 0;
  // Tokens of document d (d in [0, num_documents())).
  virtual int64_t document_length(int64_t d) const = 0;
  virtual int64_t num_tokens() const = 0;
  // Bytes per token in the file (2 for uint16, 4 for int32/uint32, …).
  virtual int token_bytes() const = 0;
  // Copies tokens [offset, offset + count) of document d into out, widened to int32.
  virtual void read(int64_t d, int64_t offset, int64_t count, int32_t* out) const = 0;
  // Where token `offset` of document d sits in its file: the file and the byte offset, for
  // errors about a token (an id beyond the model's vocabulary).
  virtual std::string locate(int64_t d, int64_t offset) const = 0;
};

}  // namespace strata
