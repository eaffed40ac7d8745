// config_reader.h — (inside launch/config/) a config's layers merged into one JSON, who set each
// key, and typed reads whose errors name that source.
//
// A config is built from layers, lowest first: the built-in defaults, the model preset, the file,
// each `--set` (config_parse.cc merges them). Values are read only after merging, so a type or
// range error names the source that last set the bad value (its file, and the key as that file
// spells it), and a consistency error names the most recently set of the keys involved (the one
// the user is most likely to have just changed).
//
// Thread-safety: a Reader reads; the JSON and the origins must outlive it.
#pragma once

#include <climits>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "launch/config/json_values.h"

namespace strata {

// Layers, lowest first. A leaf's layer decides whether ffn_hidden_size is derived from
// hidden_size and which source a consistency error blames.
enum ConfigLayer : int { kLayerDefaults = 0, kLayerPreset = 1, kLayerFile = 2, kLayerFirstSet = 3 };
// A layer set over a finished config (config_with_layer): above every --set.
constexpr int kLayerOver = INT_MAX;

struct Origin {
  std::string file;
  int layer = kLayerDefaults;
  // Prefix of the config path that the file does not spell: a preset file holds the keys of
  // the model section at its top level, so "model.hidden_size" is "hidden_size" there.
  std::string strip;
};
using Origins = std::map<std::string, Origin>;  // config path of a leaf -> who set it last

// "parent.key" ("key" at the top level).
std::string join(const std::string& parent, const std::string& key);
// "a.b" as a JSON pointer, "/a/b".
nlohmann::json::json_pointer json_path(const std::string& path);

class Reader {
 public:
  Reader(const nlohmann::json& root, const Origins& origins, std::string fallback_file)
      : root_(root), origins_(origins), fallback_file_(std::move(fallback_file)) {}

  // Every path exists: the merge starts from the defaults, which hold every key.
  const nlohmann::json& at(const std::string& path) const;
  Origin origin(const std::string& path) const;

  [[noreturn]] void fail(const std::string& path, const std::string& expected) const {
    fail_in(origin(path).file, path, expected);
  }
  // Names `path` in `file`; the path is spelled as `file` spells it when `file` set it.
  [[noreturn]] void fail_in(const std::string& file, const std::string& path,
                            const std::string& expected) const;
  // A consistency error among several keys: reported at the key set by the latest layer,
  // since that is the one the user most likely just changed (first listed on ties).
  [[noreturn]] void fail_latest(std::initializer_list<std::string> paths,
                                const std::string& expected) const;
  // The file of whichever of `paths` was set last.
  std::string latest_file(std::initializer_list<std::string> paths) const;

  void require(bool ok, const std::string& path, const std::string& expected) const {
    if (!ok) fail(path, expected + ", got " + show(at(path)));
  }

  // The value at `path` through `read`, one of json_values.h's readers (or any function of the
  // JSON value that throws ValueError): its error names the source that set the value.
  template <class Read>
  auto value(const std::string& path, Read read) const {
    try {
      return read(at(path));
    } catch (const ValueError& e) {
      fail(path, e.what());
    }
  }

 private:
  const nlohmann::json& root_;
  const Origins& origins_;
  std::string fallback_file_;
};

}  // namespace strata
