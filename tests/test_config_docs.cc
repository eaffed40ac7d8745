// test_config_docs.cc — docs/config.md in step with the config parser's key tables: every key
// the parser knows is documented with the default a config that omits it gets, and the doc names
// no key the parser would refuse.
//
// The doc's rows are "| `key` | default | meaning |", the default as JSON (strings in backticks).
// A row may group keys: "| `lr`, `min_lr` | 3e-4, 3e-5 |", or with a shared prefix
// "| `checkpoint.dir`, `.interval` | null, 0 |" (".interval" is "checkpoint.interval"), the
// defaults in the keys' order. Under a heading that names one section ("## model") a key is
// relative to it; under any other heading ("## checkpoint, log, comm, device") it is the whole
// path. Defaults are compared as JSON values, so the doc may spell 3e-4 where the tables hold
// 0.0003.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launch/config/config_parse.h"

namespace strata {
namespace {

using json = nlohmann::json;

struct DocKey {
  int line;  // 1-based, for messages
  std::string path;
  std::string default_text;  // as the doc spells it, backticks removed
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(trim(part));
  return parts;
}

// The keys of the doc's tables with their defaults. `sections` are the config's section paths,
// to tell a section heading from any other. A malformed row is a test failure.
std::vector<DocKey> parse_doc(const std::string& text, const std::set<std::string>& sections) {
  std::vector<DocKey> keys;
  std::istringstream in(text);
  std::string line;
  std::string prefix;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("## ", 0) == 0) {
      const std::string heading = trim(line.substr(3));
      prefix = sections.count(heading) ? heading + "." : "";
      continue;
    }
    if (line.rfind("| `", 0) != 0) continue;                  // prose, a header row or a separator
    const std::vector<std::string> cells = split(line, '|');  // "", key, default, meaning
    if (cells.size() < 3) {
      ADD_FAILURE() << "docs/config.md:" << n << ": expected | key | default | ...: " << line;
      continue;
    }
    std::vector<std::string> names;
    for (size_t open = cells[1].find('`'); open != std::string::npos;) {
      const size_t close = cells[1].find('`', open + 1);
      if (close == std::string::npos) break;
      names.push_back(cells[1].substr(open + 1, close - open - 1));
      open = cells[1].find('`', close + 1);
    }
    std::string defaults = cells[2];
    defaults.erase(std::remove(defaults.begin(), defaults.end(), '`'), defaults.end());
    const std::vector<std::string> values = split(defaults, ',');
    if (names.empty() || values.size() != names.size()) {
      ADD_FAILURE() << "docs/config.md:" << n << ": " << names.size() << " keys but "
                    << values.size() << " defaults: " << line;
      continue;
    }
    const std::string& first = names[0];
    const std::string parent =
        first.find('.') == std::string::npos ? "" : first.substr(0, first.rfind('.'));
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string name = names[i][0] == '.' ? parent + names[i] : names[i];
      keys.push_back({n, prefix + name, values[i]});
    }
  }
  return keys;
}

std::set<std::string> section_paths(const std::vector<ConfigKey>& keys) {
  std::set<std::string> sections;
  for (const ConfigKey& k : keys) {
    for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1))
      sections.insert(k.path.substr(0, dot));
  }
  return sections;
}

std::string read_doc() {
  const std::string path = std::string(STRATA_SOURCE_DIR) + "/docs/config.md";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The reader of the doc's format, on rows of each form, so that the checks below cannot pass
// by reading nothing.
TEST(ConfigDocs, RowFormsAreRead) {
  const std::string doc =
      "## model\n"
      "| key | default | meaning |\n"
      "|---|---|---|\n"
      "| `arch` | `\"gpt\"` | only `gpt` |\n"
      "| `lr`, `min_lr` | 3e-4, 3e-5 | |\n"
      "## data\n"
      "| `synthetic.vocab_size`, `.order` | 64, 2 | the chain |\n"
      "## checkpoint, log\n"
      "| `checkpoint.dir`, `.keep` | null, 3 | |\n"
      "| `device` | `\"auto\"` | |\n";
  const std::vector<DocKey> keys = parse_doc(doc, {"model", "data", "data.synthetic"});
  std::vector<std::string> got;
  for (const DocKey& k : keys) got.push_back(k.path + "=" + k.default_text);
  EXPECT_EQ(got, (std::vector<std::string>{"model.arch=\"gpt\"", "model.lr=3e-4",
                                           "model.min_lr=3e-5", "data.synthetic.vocab_size=64",
                                           "data.synthetic.order=2", "checkpoint.dir=null",
                                           "checkpoint.keep=3", "device=\"auto\""}));
  EXPECT_EQ(keys[3].line, 7);
}

TEST(ConfigDocs, EveryKeyDocumentedWithItsDefault) {
  const std::vector<ConfigKey> table = config_keys();
  ASSERT_FALSE(table.empty());
  std::map<std::string, DocKey> doc;
  for (const DocKey& k : parse_doc(read_doc(), section_paths(table))) doc.emplace(k.path, k);
  for (const ConfigKey& k : table) {
    SCOPED_TRACE(k.path);
    const auto it = doc.find(k.path);
    if (it == doc.end()) {
      ADD_FAILURE() << "docs/config.md does not document " << k.path << " (default "
                    << k.default_json << ": " << k.meaning << ")";
      continue;
    }
    const json spelled = json::parse(it->second.default_text, nullptr, false);
    EXPECT_FALSE(spelled.is_discarded()) << "docs/config.md:" << it->second.line << ": default "
                                         << it->second.default_text << " is not JSON";
    EXPECT_EQ(spelled, json::parse(k.default_json))
        << "docs/config.md:" << it->second.line << ": default " << it->second.default_text
        << ", the parser's is " << k.default_json;
  }
}

TEST(ConfigDocs, NamesOnlyKnownKeysOnce) {
  const std::vector<ConfigKey> table = config_keys();
  std::set<std::string> known;
  for (const ConfigKey& k : table) known.insert(k.path);
  std::map<std::string, int> seen;  // path -> line of its first row
  for (const DocKey& k : parse_doc(read_doc(), section_paths(table))) {
    EXPECT_TRUE(known.count(k.path))
        << "docs/config.md:" << k.line << ": " << k.path << " is not a config key";
    const auto [it, fresh] = seen.emplace(k.path, k.line);
    EXPECT_TRUE(fresh) << "docs/config.md:" << k.line << ": " << k.path
                       << " documented again (first at line " << it->second << ")";
  }
}

}  // namespace
}  // namespace strata
