// token_shards.h — llm.c's token shards (karpathy/llm.c, dev/data/data_common.py
// write_datafile; llmc/dataloader.h reads them), read as one TokenCorpus and written.
//
// A shard is a header of 256 little-endian int32 — [0] magic, [1] version, [2] token count,
// the rest 0 — then the tokens. llm.c defines two kinds, both read and written here:
//   magic 20240520, version 1: uint16 tokens (GPT-2's tokenizer; master and every branch)
//   magic 20240801, version 7: uint32 tokens (Llama 3's tokenizer; the llama3 branch and
//                              master's data_common.py, HEADERS_INFO["llama-3"])
// The count is an int32, so a shard holds fewer than 2^31 tokens; the file is exactly
// 1024 + count × token size bytes.
//
// Documents. A shard carries no document index: llm.c's scripts put an end-of-text token
// before every document and concatenate. Finding those boundaries would mean scanning every
// token at open (and knowing the tokenizer's end-of-text id), which is what mapping avoids.
// Whole shards as documents would leave a single-shard corpus with one document, which cannot
// be split into training and validation documents. So a document here is a fixed-size chunk:
// each shard, in order, is cut into chunks of `document_tokens` tokens (2^20 by default), the
// last chunk of a shard shorter. Chunks never span two shards. The GPT dataset concatenates
// documents to build its sequences, so a chunk boundary costs nothing; what it buys is a
// corpus that divides by documents into train and validation, O(1) to index (nothing is
// stored per document).
//
// Errors (InputError naming the file and byte): a missing file; a glob matching nothing
// (named by the pattern); a file shorter than its header; magic or version wrong (byte 0, 4);
// a negative count (byte 8); a file shorter or longer than the count says; shards of
// different token sizes in one corpus; 0 tokens in all; a uint32 token beyond int32 (read()).
//
// Thread-safety: the corpus is immutable after open; its const methods may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/data/binary_io.h"
#include "runtime/data/corpus.h"

namespace strata {

// Tokens per document of a shard corpus (the last document of each shard is shorter).
constexpr int64_t kShardDocumentTokens = int64_t{1} << 20;

// Opens one shard (`pattern` is a path) or several (`pattern` contains *, ? or [ : glob(3),
// matches sorted by byte order of their paths, e.g. fineweb_train_000001.bin,
// fineweb_train_000002.bin, …), each memory-mapped, as one corpus whose documents are the
// shards' chunks of document_tokens tokens, in that order. path() is the pattern; locate()
// names the shard. Throws InputError (above), std::invalid_argument for document_tokens < 1.
std::unique_ptr<TokenCorpus> open_token_shards(const std::string& pattern,
                                               int64_t document_tokens = kShardDocumentTokens);

// Writes n tokens as one shard at `path`: token_bytes 2 writes llm.c's GPT-2 format (magic
// 20240520, version 1, uint16), 4 its Llama 3 format (20240801, version 7, uint32). Written
// to a temporary beside `path` and renamed into place. Throws std::invalid_argument for
// another token_bytes, n outside [0, 2^31) or a token outside the type (uint16: 0..65535;
// uint32: non-negative, as the tokens are int32), InputError when the file cannot be written.
void write_token_shard(const std::string& path, const int32_t* tokens, int64_t n, int token_bytes);
// The same, complete under its temporary name (binary_io::AtomicFile): the caller renames it, so
// that several shards go in place together (data prepare's publishing), or none.
std::unique_ptr<binary_io::AtomicFile> write_token_shard_unpublished(const std::string& path,
                                                                     const int32_t* tokens,
                                                                     int64_t n, int token_bytes);

}  // namespace strata
