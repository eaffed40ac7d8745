// error.h — the two error paths of Strata.
//
// InputError is for what a user can fix (usage, config, data file, checkpoint, infeasible
// plan). It is thrown anywhere and caught once at the command boundary (launch/main.cc), which
// prints exactly one line
//     error: <file>: <json.path or byte offset>: <what was expected>
// and exits with status 2. Device and communication failures mid-step do not use it: they go
// through the *_CHECK macros of check.h, which print full context and abort the job (status 1).
//
// Thread-safety: plain value types, no shared state.
#pragma once

#include <stdexcept>
#include <string>

namespace strata {

class InputError : public std::runtime_error {
 public:
  // file: the file the bad input came from ("<command line>" for flags);
  // where: a JSON path ("train.micro_batch_size"), a byte offset ("byte 1024") or "";
  // expected: what was expected, in words.
  InputError(std::string file, std::string where, std::string expected)
      : std::runtime_error(format(file, where, expected)),
        file_(std::move(file)),
        where_(std::move(where)),
        expected_(std::move(expected)) {}

  const std::string& file() const { return file_; }
  const std::string& where() const { return where_; }
  const std::string& expected() const { return expected_; }

 private:
  static std::string format(const std::string& f, const std::string& w, const std::string& e) {
    std::string s = "error: " + f + ": ";
    if (!w.empty()) s += w + ": ";
    return s + e;
  }
  std::string file_, where_, expected_;
};

}  // namespace strata
