// args.h — command-line helpers shared by the subcommands: every flag takes "--flag value" or
// "--flag=value", and a bad one is an InputError on "<command line>" (exit status 2).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/io/input_file.h"

namespace strata {

[[noreturn]] inline void bad_flag(const std::string& flag, const std::string& expected) {
  throw InputError("<command line>", flag, expected);
}

// When args[i] is `flag` ("--flag value" or "--flag=value"), stores the value in *out, moves i
// past what it consumed (to the value's index; the caller's loop then steps over it) and
// returns true. A flag missing its value is an InputError.
inline bool flag_value(const std::vector<std::string>& args, size_t& i, const char* flag,
                       std::string* out) {
  const std::string& a = args[i];
  const std::string f = flag;
  if (a == f) {
    if (i + 1 >= args.size()) bad_flag(f, "a value after " + f);
    *out = args[++i];
    return true;
  }
  if (a.rfind(f + "=", 0) == 0) {
    *out = a.substr(f.size() + 1);
    return true;
  }
  return false;
}

// Checks, before a command does its work, that the file `flag` names can be written: an
// InputError naming the flag when it is a directory, a FIFO (whose open would block), in a
// missing directory, or not writable (runtime/io/input_file.h's output_file_problem).
inline void check_output_flag(const std::string& flag, const std::string& path) {
  const std::string why = output_file_problem(path);
  if (!why.empty()) bad_flag(flag, "a file path that can be written, got \"" + path + "\": " + why);
}

// The value of `flag` as an integer in [1, max]; anything else (a sign, other characters, an
// empty or too long value) is an InputError naming the flag.
inline int positive_int(const std::string& flag, const std::string& text, int max = 1 << 30) {
  const std::string expected = std::string("a positive integer") +
                               (max < (1 << 30) ? " up to " + std::to_string(max) : "") + ", got " +
                               (text.empty() ? "\"\"" : text);
  if (text.empty() || text.size() > 9) bad_flag(flag, expected);
  for (char c : text)
    if (c < '0' || c > '9') bad_flag(flag, expected);
  const int value = std::stoi(text);
  if (value < 1 || value > max) bad_flag(flag, expected);
  return value;
}

}  // namespace strata
