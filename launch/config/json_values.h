// json_values.h — one JSON value checked against what a key or a field holds, wherever the value
// came from: a config file, a `--set`, a plan file, `strata plan --fix`.
//
// Each reader returns the value or throws ValueError, whose text says what was expected and what
// was found ("expected a positive integer, got 0"). The caller knows where the value came from
// and turns it into the InputError that names that place (the config's Reader: the file that set
// the key; a plan file: "plans[0].tensor"; --fix: "<command line>").
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata {

// What a value should have been, without the place (the caller adds it).
class ValueError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value as the user wrote it, cut short (60 characters) so that one error stays one line.
std::string show(const nlohmann::json& v);

// An integer-valued JSON number; 3.0 counts, 3.5 does not. Values beyond int64 saturate, which
// every caller then refuses as out of range.
std::optional<int64_t> as_int64(const nlohmann::json& v);

// "a", "b", "c" joined by `sep`; each item in double quotes.
std::string join_list(const std::vector<std::string>& items, const std::string& sep);
std::vector<std::string> quoted(const std::vector<std::string>& items);

// An integer >= min and at most INT_MAX.
int int_value(const nlohmann::json& v, int64_t min);
// The same, or null.
std::optional<int> optional_int_value(const nlohmann::json& v, int64_t min);
// A non-negative integer below 2^64.
uint64_t seed_value(const nlohmann::json& v);
double number_value(const nlohmann::json& v);
bool bool_value(const nlohmann::json& v);
// A non-empty string, or null (the optional strings of a config are file paths: "" would only
// fail later, far from the config).
std::optional<std::string> optional_string_value(const nlohmann::json& v);
// One of `options`.
std::string one_of_value(const nlohmann::json& v, const std::vector<std::string>& options);
// An array of integers in [1, INT_MAX], or null.
std::optional<std::vector<int>> optional_positive_array_value(const nlohmann::json& v);

}  // namespace strata
