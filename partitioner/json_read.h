// json_read.h — the checks the partitioner's JSON readers share (cluster.cc, efficiency.cc):
// a number at a key, a set of known keys; each failure an InputError(file, json.path,
// expected) (runtime/base/error.h).
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/base/error.h"

namespace strata::json_read {

inline std::string join_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// j[key] as a number, positive (or non-negative); `path` is j's own path.
inline double number(const nlohmann::json& j, const std::string& key, const std::string& path,
                     const std::string& file, bool positive = true) {
  const std::string where = join_path(path, key);
  if (!j.contains(key)) throw InputError(file, where, "a number (missing)");
  const nlohmann::json& v = j.at(key);
  if (!v.is_number()) throw InputError(file, where, "a number, got " + v.dump());
  const double x = v.get<double>();
  if (positive ? !(x > 0) : !(x >= 0)) {
    throw InputError(
        file, where,
        std::string(positive ? "a positive" : "a non-negative") + " number, got " + v.dump());
  }
  return x;
}

// Every key of object j is one of `keys`.
inline void only_keys(const nlohmann::json& j, const std::vector<std::string>& keys,
                      const std::string& path, const std::string& file) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
      std::string list;
      for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
      throw InputError(file, join_path(path, it.key()), "a known key (" + list + ")");
    }
  }
}

// j[key] as an object (InputError naming `what` when it is not one).
inline const nlohmann::json& object(const nlohmann::json& j, const std::string& key,
                                    const std::string& path, const std::string& file,
                                    const std::string& what) {
  if (!j.contains(key) || !j.at(key).is_object())
    throw InputError(file, join_path(path, key), what);
  return j.at(key);
}

}  // namespace strata::json_read
