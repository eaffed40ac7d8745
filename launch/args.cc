#include "launch/args.h"

#include <algorithm>
#include <cstdio>

namespace strata {

bool read_flags(const std::vector<std::string>& args, const std::vector<Flag>& flags,
                const char* usage, const std::string& expected) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return false;
    }
    bool taken = false;
    for (const Flag& f : flags) {
      std::string v;
      if (f.kind == Flag::Kind::kValue) {
        if (!flag_value(args, i, f.name.c_str(), &v)) continue;
      } else if (a != f.name) {
        continue;
      } else if (f.kind == Flag::Kind::kOptionalWord && i + 1 < args.size() &&
                 std::find(f.words.begin(), f.words.end(), args[i + 1]) != f.words.end()) {
        v = args[++i];
      }
      f.take(v);
      taken = true;
      break;
    }
    if (!taken) bad_flag(a, expected);
  }
  return true;
}

}  // namespace strata
