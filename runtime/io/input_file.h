// input_file.h — opening the files Strata reads: configs and presets, plans, clusters, profiles,
// data files, tokenizers, eval tasks, Hugging Face directories, checkpoints.
//
// Every input must be a regular file: a FIFO blocks its reader until a writer comes (forever,
// for a config), a device such as /dev/zero never ends, a directory is not data. A file read
// into memory must also be at most a size its reader can hold (the limits below), so that a
// wrong path fails at once instead of exhausting memory. Anything else is an InputError naming
// the file and what was expected (exit status 2), before the content is read.
//
// Files are opened with O_NONBLOCK, so that a path replaced by a FIFO after the check cannot
// block either. A file read whole must hold exactly the bytes its size says: a /proc or /sys
// file (size 0, content made up as it is read) or one that changes while read is refused.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// Limits of the files read whole into memory; a limit is a promise to the reader, not a
// tuning knob (docs/config.md lists them).
// Configs, presets, plans, clusters, profiles, Hugging Face config.json files, checkpoint
// metadata: a few KB each; 64 MiB leaves room for any generated one.
constexpr uint64_t kMaxJsonFileBytes = uint64_t{64} << 20;
// tokenizer.json (tens of MB for a 256k vocabulary) and tiktoken rank files.
constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{1} << 30;
// Text read whole: data.source "text", strata data prepare's inputs, eval task files.
// Larger corpora are tokenized once (strata data prepare) and memory-mapped.
constexpr uint64_t kMaxTextFileBytes = uint64_t{16} << 30;
// For files read in pieces (safetensors, memory-mapped token files): any size.
constexpr uint64_t kAnySize = UINT64_MAX;

// The size of `path` when it is a regular file of at most max_bytes (following symbolic links);
// InputError(path, "", what was expected) otherwise. For readers that stream the file.
uint64_t check_input_file(const std::string& path, uint64_t max_bytes);

// The bytes of `path`, with the checks of check_input_file; InputError when the bytes read are
// not the file's size.
std::string read_input_file(const std::string& path, uint64_t max_bytes);
std::vector<uint8_t> read_input_bytes(const std::string& path, uint64_t max_bytes);

// Outputs are checked the same way before a long job starts writing them: "" when `path` can be
// written as a file (an existing regular file or character device — /dev/null, /dev/stdout —
// opened for appending and left as it was, or a new file in an existing directory, created and
// removed again), else what it is instead ("a directory", "a FIFO (named pipe)", "not
// writable: Permission denied", ...).
std::string output_file_problem(const std::string& path);
// "" when `path` is a directory files can be created in; made (with its parents) when missing.
std::string output_directory_problem(const std::string& path);

}  // namespace strata
