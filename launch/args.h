// args.h — command-line helpers shared by the subcommands: every flag takes "--flag value" or
// "--flag=value", and a bad one is an InputError on "<command line>" (exit status 2). A command
// lists its flags as a table (Flag) and read_flags() walks its arguments through it.
//
// Thread-safety: pure functions.
#pragma once

#include <functional>
#include <string>
#include <utility>
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

// bad_flag pointing at the command's help: "<expected> (see strata <command> --help)".
[[noreturn]] inline void bad_flag_of(const std::string& command, const std::string& flag,
                                     const std::string& expected) {
  bad_flag(flag, expected + " (see strata " + command + " --help)");
}

// Checks, before a command does its work, that the file `flag` names can be written: an
// InputError naming the flag when it is a directory, a FIFO (whose open would block), in a
// missing directory, or not writable (runtime/io/input_file.h's output_file_problem).
inline void check_output_flag(const std::string& flag, const std::string& path) {
  const std::string why = output_file_problem(path);
  if (!why.empty()) bad_flag(flag, "a file path that can be written, got \"" + path + "\": " + why);
}

// The value of `flag` as a number (strtod's forms), else an InputError naming the flag.
inline double number_arg(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const double x = std::stod(text, &used);
    if (used == text.size()) return x;
  } catch (const std::exception&) {
  }
  bad_flag(flag, "a number, got \"" + text + "\"");
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

// One flag of a command and what its value does.
struct Flag {
  enum class Kind {
    kValue,         // "--flag value" or "--flag=value"
    kSwitch,        // "--flag" alone: take("")
    kOptionalWord,  // "--flag [word]": take(word) when the next argument is one of `words`, else
                    // take("")
  };
  std::string name;
  Kind kind = Kind::kValue;
  std::function<void(const std::string& value)> take;
  std::vector<std::string> words;  // kOptionalWord
};

// The common kinds: any value, a string, a positive integer (positive_int), a non-empty path, a
// switch.
inline Flag value_flag(const std::string& name, std::function<void(const std::string&)> take) {
  return {name, Flag::Kind::kValue, std::move(take), {}};
}
inline Flag text_flag(const std::string& name, std::string* out) {
  return {name, Flag::Kind::kValue, [out](const std::string& v) { *out = v; }, {}};
}
inline Flag positive_flag(const std::string& name, int* out, int max = 1 << 30) {
  return {name,
          Flag::Kind::kValue,
          [name, out, max](const std::string& v) { *out = positive_int(name, v, max); },
          {}};
}
// A value that must not be empty (a path); `expected` says what it names.
inline Flag path_flag(const std::string& name, std::string* out, const std::string& expected) {
  return {name,
          Flag::Kind::kValue,
          [name, out, expected](const std::string& v) {
            if (v.empty()) bad_flag(name, expected);
            *out = v;
          },
          {}};
}
inline Flag switch_flag(const std::string& name, bool* on) {
  return {name, Flag::Kind::kSwitch, [on](const std::string&) { *on = true; }, {}};
}

// Walks `args` through `flags`. --help or -h prints `usage` and returns false (the command then
// exits 0); an argument no flag takes is an InputError naming it, with `expected` (e.g. "an
// option of strata plan (see strata plan --help)").
bool read_flags(const std::vector<std::string>& args, const std::vector<Flag>& flags,
                const char* usage, const std::string& expected);

}  // namespace strata
