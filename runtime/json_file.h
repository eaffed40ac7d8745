// json_file.h — reading a JSON input file with the one-line errors of DESIGN.md.
//
// Thread-safety: pure function.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace strata {

// `text` parsed as JSON; InputError(file, "byte N", "valid JSON (<the parser's words>)") when it
// does not parse.
inline nlohmann::json parse_json_string(const std::string& text, const std::string& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    const size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    throw InputError(file, "byte " + std::to_string(e.byte), "valid JSON (" + what + ")");
  }
}

// The parsed contents of `path`. InputError(path, "", "a readable JSON file") when it cannot be
// read, InputError(path, "byte N", "valid JSON (<the parser's words>)") when it does not parse.
inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "", "a readable JSON file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_string(ss.str(), path);
}

}  // namespace strata
