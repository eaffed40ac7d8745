// tokenizer_fixtures.h — pieces of tokenizer.json the tokenizer, dataset and fuzzer tests build.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata::test_fixtures {

// A pre_tokenizer that splits on `regex` (Isolated), then maps bytes as GPT-2 does: put in a
// tokenizer.json's "pre_tokenizer" to make a tokenizer with that pattern (one that backtracks
// without end on some text, say).
inline nlohmann::json split_pre_tokenizer(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

}  // namespace strata::test_fixtures
