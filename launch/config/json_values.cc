#include "launch/config/json_values.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace strata {
namespace {

using json = nlohmann::json;

// The first `limit` characters or more of v's JSON text, serialised only that far: a value of
// any size costs no more than the cut. Bytes that are not UTF-8 (a --set string) are replaced.
void append_json_prefix(const json& v, size_t limit, std::string* out) {
  auto text = [](const json& x) { return x.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (v.is_object() || v.is_array()) {
    *out += v.is_object() ? '{' : '[';
    for (auto it = v.begin(); it != v.end() && out->size() < limit; ++it) {
      if (it != v.begin()) *out += ',';
      if (v.is_object()) *out += text(json(it.key())) + ':';
      append_json_prefix(it.value(), limit, out);
    }
    *out += v.is_object() ? '}' : ']';
  } else if (v.is_string()) {
    *out += text(json(v.get_ref<const std::string&>().substr(0, limit)));
  } else {
    *out += text(v);
  }
}

std::optional<int> integer(const json& v, int64_t min, bool nullable) {
  if (nullable && v.is_null()) return std::nullopt;
  const std::string or_null = nullable ? " or null" : "";
  const std::optional<int64_t> n = as_int64(v);
  if (!n) throw ValueError("expected an integer" + or_null + ", got " + show(v));
  if (*n < min) {
    const std::string what = min == 1   ? "a positive integer"
                             : min == 0 ? "a non-negative integer"
                                        : "an integer >= " + std::to_string(min);
    throw ValueError("expected " + what + or_null + ", got " + show(v));
  }
  if (*n > INT_MAX) {
    throw ValueError("expected an integer at most " + std::to_string(INT_MAX) + ", got " + show(v));
  }
  return static_cast<int>(*n);
}

}  // namespace

std::string show(const json& v) {
  constexpr size_t kMaxChars = 60;
  std::string s;
  append_json_prefix(v, kMaxChars + 1, &s);
  if (s.size() > kMaxChars) {
    size_t cut = kMaxChars;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s = s.substr(0, cut) + "...";
  }
  return s;
}

std::optional<int64_t> as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) return std::nullopt;
    if (d >= 9.2e18) return INT64_MAX;
    if (d <= -9.2e18) return INT64_MIN;
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::string join_list(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

std::vector<std::string> quoted(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& s : items) out.push_back("\"" + s + "\"");
  return out;
}

int int_value(const json& v, int64_t min) {
  return *integer(v, min, /*nullable=*/false);
}

std::optional<int> optional_int_value(const json& v, int64_t min) {
  return integer(v, min, /*nullable=*/true);
}

uint64_t seed_value(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^64 is exactly representable; anything below it that is integral fits in uint64.
    if (std::isfinite(d) && std::floor(d) == d && d >= 0 && d < 18446744073709551616.0) {
      return static_cast<uint64_t>(d);
    }
  }
  throw ValueError("expected a non-negative integer, got " + show(v));
}

double number_value(const json& v) {
  if (!v.is_number()) throw ValueError("expected a number, got " + show(v));
  return v.get<double>();
}

bool bool_value(const json& v) {
  if (!v.is_boolean()) throw ValueError("expected a boolean, got " + show(v));
  return v.get<bool>();
}

std::optional<std::string> optional_string_value(const json& v) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_string()) throw ValueError("expected a string or null, got " + show(v));
  if (v.get<std::string>().empty())
    throw ValueError("expected a non-empty string or null, got \"\"");
  return v.get<std::string>();
}

std::string one_of_value(const json& v, const std::vector<std::string>& options) {
  if (v.is_string() &&
      std::find(options.begin(), options.end(), v.get<std::string>()) != options.end()) {
    return v.get<std::string>();
  }
  throw ValueError("expected one of " + join_list(quoted(options), ", ") + ", got " + show(v));
}

std::optional<std::vector<int>> optional_positive_array_value(const json& v) {
  if (v.is_null()) return std::nullopt;
  const std::string expected = "expected an array of positive integers or null, got " + show(v);
  if (!v.is_array()) throw ValueError(expected);
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::optional<int64_t> n = as_int64(v[i]);
    if (!n || *n < 1 || *n > INT_MAX) {
      throw ValueError(expected + " (entry " + std::to_string(i) + " is " + show(v[i]) + ")");
    }
    out.push_back(static_cast<int>(*n));
  }
  return out;
}

}  // namespace strata
