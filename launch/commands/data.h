// commands/data.h — `strata data prepare`: text or JSON Lines to a tokenized dataset.
//
//   strata data prepare --tokenizer FILE --input FILE... --output PREFIX
//                       [--format megatron|llmc] [--json-key text] [--documents file|paragraphs]
//                       [--threads N] [--no-eod] [--shard-tokens N]
//
// Inputs: a file ending in .jsonl or .json is JSON Lines, one document per line (its `text`
// field, --json-key); any other file is UTF-8 text, one document per file or, with
// --documents paragraphs, per run of lines between blank lines. Each document is tokenized with
// the tokenizer (runtime/data/tokenizer.h; documents in parallel over --threads), followed by the
// end-of-document token (unless --no-eod), and written as Megatron-LM's indexed dataset
// PREFIX.idx + PREFIX.bin (uint16 tokens when the vocabulary fits, else int32) or as llm.c token
// shards PREFIX_000000.bin, … of --shard-tokens tokens each. Outputs appear atomically (written
// aside, then renamed). Long inputs print progress to stderr; the end prints documents, tokens
// and throughput.
//
// Thread-safety: one call at a time.
#pragma once

#include <string>
#include <vector>

namespace strata {

// Runs `strata data ARGS` (ARGS after "data"); returns the exit status. Throws InputError for bad
// arguments or inputs.
int cmd_data(const std::vector<std::string>& args);

}  // namespace strata
