// error.h — the two error paths of Strata.
//
// InputError is for what a user can fix (usage, config, data file, checkpoint, infeasible
// plan). It is thrown anywhere and caught once at the command boundary (launch/main.cc), which
// prints exactly one line
//     error: <file>: <json.path or byte offset>: <what was expected>
// and exits with status 2. Control characters in any part (a NUL or a newline in a key, a file
// name or a --set value) are written as \xNN, so that the line is one line and is not cut short,
// and each part is cut to kMaxPartBytes. Device and communication failures mid-step do not use
// it: they go through the *_CHECK macros of check.h, which print full context and abort the job
// (status 1).
//
// Thread-safety: plain value types, no shared state.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace strata {

class InputError : public std::runtime_error {
 public:
  // file: the file the bad input came from ("<command line>" for flags);
  // where: a JSON path ("train.micro_batch_size"), a byte offset ("byte 1024") or "";
  // expected: what was expected, in words.
  InputError(const std::string& file, const std::string& where, const std::string& expected)
      : std::runtime_error(format(printable(file), printable(where), printable(expected))),
        file_(printable(file)),
        where_(printable(where)),
        expected_(printable(expected)) {}

  const std::string& file() const { return file_; }
  const std::string& where() const { return where_; }
  const std::string& expected() const { return expected_; }

  // `s` with its control bytes (below 0x20, and 0x7F) written as \xNN, and cut to at most
  // kMaxPartBytes (a key a megabyte long still makes a readable line). Idempotent: its result
  // needs neither, so a message rebuilt from the parts of another reads the same.
  static constexpr size_t kMaxPartBytes = 1000;
  static std::string printable(const std::string& s) {
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    for (const char ch : s) {
      const unsigned char c = static_cast<unsigned char>(ch);
      if (c >= 0x20 && c != 0x7F) {
        out += ch;
      } else {
        out += "\\x";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
      }
      if (out.size() > kMaxPartBytes) break;
    }
    if (out.size() > kMaxPartBytes) {
      size_t cut = kMaxPartBytes - 3;
      // Back to the start of a UTF-8 character, so that the cut leaves valid text.
      while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
      out.resize(cut);
      out += "...";
    }
    return out;
  }

 private:
  static std::string format(const std::string& f, const std::string& w, const std::string& e) {
    std::string s = "error: " + f + ": ";
    if (!w.empty()) s += w + ": ";
    return s + e;
  }
  std::string file_, where_, expected_;
};

// Weights read from a file must be finite: a NaN or an infinity in them would train or decode
// nothing, silently. InputError naming the file, `where` (the tensor) and the first bad element.
inline void expect_finite(const std::string& file, const std::string& where, const float* v,
                          int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      throw InputError(file, where,
                       "finite values; element " + std::to_string(i) + " is " +
                           (std::isnan(v[i]) ? "NaN"
                            : v[i] > 0       ? "+inf"
                                             : "-inf"));
}

}  // namespace strata
