// json_file.h — reading JSON input (files, --set values) with the one-line errors of
// docs/contracts.md.
//
// Beyond the parser's own checks: nesting deeper than kMaxJsonDepth is refused while parsing (a
// file nested 100k deep took seconds and then overflowed the stack of whatever walked it), and a
// number beyond double's range is an InputError at its JSON path, not the parser's exception.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "runtime/io/input_file.h"

namespace strata {

// Objects and arrays inside each other at most this deep. The deepest file Strata reads (a
// tokenizer.json's normalizer sequences) nests about 8 levels.
constexpr int kMaxJsonDepth = 64;

enum class DuplicateKeys {
  kKeepLast,  // nlohmann's default: the last of duplicate keys wins
  kRefuse,    // InputError: a config that says "lr" twice is almost always an editing mistake
};

// `text` parsed; `file` names it in errors: InputError(file, "byte N", "expected valid JSON
// (<the parser's words>)") when it does not parse, InputError(file, <JSON path>, ...) for
// nesting beyond kMaxJsonDepth, a number beyond double's range and (kRefuse) a duplicate key.
nlohmann::json parse_json(const std::string& text, const std::string& file,
                          DuplicateKeys duplicates = DuplicateKeys::kKeepLast);

// As parse_json, but text that is not JSON at all gives std::nullopt (`--set a.b=v` then takes
// v as a string). JSON Strata cannot hold (too deep, a number beyond double's range) is still
// an InputError.
std::optional<nlohmann::json> parse_json_if_json(const std::string& text, const std::string& file);

// The parsed contents of `path`: read_input_file's checks (a regular file of at most
// max_bytes), then parse_json's.
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes = kMaxJsonFileBytes,
                              DuplicateKeys duplicates = DuplicateKeys::kKeepLast);

// `text` with every lone UTF-16 surrogate escape (a \uD800-\uDFFF that is not the high half
// followed by the low half of a pair) written as \uFFFD, the replacement character, as Python's
// json (with errors="replace" on encoding) and tiktoken's readers take it; *replaced counts them.
// nlohmann's parser refuses a lone surrogate, which would cost a whole document.
std::string json_replace_lone_surrogates(const std::string& text, int64_t* replaced = nullptr);

}  // namespace strata
