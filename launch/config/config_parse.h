// config_parse.h — loading and validating the training configuration (runtime/base/config.h).
//
// Sources, later ones overriding earlier ones: built-in defaults < the model preset named by
// model.preset (configs/models/<name>.json) < the keys of the config file < each `--set a.b=v`.
// Unknown keys, wrong types, out-of-range values and inconsistent combinations throw InputError
// naming the file, the JSON path and what was expected (exit status 2 at the command boundary).
//
// The jobs of launch/config/: config_parse.cc layers the sources (presets, --set, merging);
// config_reader.h reads the merged JSON naming the source of each key, through json_values.h's
// checks of one value; config_schema.cc holds the key tables; config_checks.cc the checks that
// combine keys; world_layout.h the checks and arithmetic that need the world size.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/base/config.h"

namespace strata {

// Where model presets live: $STRATA_CONFIGS/models, else <source dir>/configs/models, else
// configs/models beside the executable's install prefix.
std::string configs_dir();

// Loads a config file (path may be empty: defaults only), applies `sets` ("a.b=v", value parsed
// as JSON, else taken as a string), validates. Throws InputError.
//
// Paths (model.init_from, data.path, data.blend's, data.tokenizer, checkpoint.dir and .resume,
// log.metrics, log.trace): a relative one written in a file counts from that file's folder (the
// config's, a preset's), so a config works from any directory, and Config holds it joined to
// that folder ("configs/train/../x.txt"); one given by --set counts from the current directory,
// where it was typed, and is kept as given. Absolute paths are kept.
Config load_config(const std::string& path, const std::vector<std::string>& sets);

// What an error about `file` adds when `file` is a relative path of a config this process loaded
// (or lies under one: a file of a checkpoint.dir, an indexed prefix's .idx, a glob's shard), or
// when the error is at such a path's key (`where` "data.path": a missing data file is the
// config's error): " (data.path \"x.txt\", relative to the config file's folder /abs/dir)", or
// "relative to the current directory /abs" for --set; "" otherwise. Thread-safe.
std::string config_path_note(const std::string& file, const std::string& where = "");

// Same from an in-memory JSON object; `file` names it in errors (and its folder is the one
// relative paths count from, unless it is a name in <angle brackets>).
Config config_from_json(const nlohmann::json& j, const std::string& file,
                        const std::vector<std::string>& sets = {});

// `c` with the keys of `layer` (a JSON object of config keys, as a config file spells them) set
// over it by `file`: the keys' own checks and the checks that combine keys run again, and an
// error at one of the layer's keys names `file` (strata train --plan sets the layout a plan
// chose). Throws InputError.
Config config_with_layer(const Config& c, const nlohmann::json& layer, const std::string& file);

// `m` checked as the model section of a config would be (each key's range, heads dividing
// hidden_size, ...), errors naming `file` and the model key: for a model read from elsewhere
// (a Hugging Face config.json). Throws InputError.
ModelConfig checked_model(const ModelConfig& m, const std::string& file);
// `m` as a config's model section (every key, preset null), which config_from_json reads back
// as `m`.
nlohmann::json model_section(const ModelConfig& m);

// The model keys of a preset (configs/models/<name>.json); InputError if unknown.
nlohmann::json load_model_preset(const std::string& name, const std::string& file,
                                 const std::string& where);

// One key of the config as the parser's tables hold it: its JSON path ("data.synthetic.order"),
// its default in the defaults layer as JSON text (what a config that omits the key gets, before
// any preset: model.preset is "\"gpt2-124m\""), and its meaning in one line.
struct ConfigKey {
  std::string path;
  std::string default_json;
  std::string meaning;
};

// Every leaf key, in docs/config.md's order; docs/config.md is checked against this list.
std::vector<ConfigKey> config_keys();

}  // namespace strata
