#include "launch/config/config_reader.h"

#include <algorithm>

#include "runtime/base/error.h"

namespace strata {

using json = nlohmann::json;

std::string join(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

json::json_pointer json_path(const std::string& path) {
  std::string p = "/" + path;
  std::replace(p.begin(), p.end(), '.', '/');
  return json::json_pointer(p);
}

const json& Reader::at(const std::string& path) const {
  const json* v = &root_;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    v = &v->at(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return *v;
    start = dot + 1;
  }
}

Origin Reader::origin(const std::string& path) const {
  const auto it = origins_.find(path);
  return it == origins_.end() ? Origin{fallback_file_, kLayerDefaults, ""} : it->second;
}

void Reader::fail_in(const std::string& file, const std::string& path,
                     const std::string& expected) const {
  const Origin o = origin(path);
  std::string where = path;
  if (o.file == file && !o.strip.empty() && where.rfind(o.strip, 0) == 0) {
    where = where.substr(o.strip.size());
  }
  throw InputError(file, where, expected);
}

void Reader::fail_latest(std::initializer_list<std::string> paths,
                         const std::string& expected) const {
  const std::string* latest = paths.begin();
  for (const std::string& p : paths) {
    if (origin(p).layer > origin(*latest).layer) latest = &p;
  }
  fail(*latest, expected);
}

std::string Reader::latest_file(std::initializer_list<std::string> paths) const {
  Origin best = origin(*paths.begin());
  for (const std::string& p : paths) {
    if (origin(p).layer > best.layer) best = origin(p);
  }
  return best.file;
}

}  // namespace strata
