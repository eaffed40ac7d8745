// json_file.cc — parse_json over nlohmann's callback parser, which reports each object, array
// and key as it reads them: the stack of open containers gives the JSON path and the depth.
#include "runtime/io/json_file.h"

#include <set>
#include <vector>

#include "runtime/base/error.h"

namespace strata {
namespace {

using json = nlohmann::json;

// One open object or array.
struct Frame {
  bool is_object = false;
  std::string key;             // objects: the latest key
  int64_t elements = 0;        // arrays: elements read so far
  std::set<std::string> keys;  // objects, with DuplicateKeys::kRefuse: the keys read so far
};

// The JSON path of what is being read: "optimizer.lr", "parallel.layers_per_stage[1]".
std::string path_of(const std::vector<Frame>& stack) {
  std::string path;
  for (const Frame& f : stack) {
    if (f.is_object) {
      path += (path.empty() ? "" : ".") + f.key;
    } else {
      path += "[" + std::to_string(f.elements) + "]";
    }
  }
  return path;
}

// The parser's words without its "[json.exception.parse_error.101] " prefix.
std::string parser_words(const std::string& what) {
  const size_t bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

// Parses `text`; a syntax error throws InputError, or returns nullopt when `syntax_is_empty`.
std::optional<json> parse(const std::string& text, const std::string& file,
                          DuplicateKeys duplicates, bool syntax_is_empty) {
  std::vector<Frame> stack;
  // An element of an array ended: the next one has the next index.
  auto element_done = [&stack]() {
    if (!stack.empty() && !stack.back().is_object) ++stack.back().elements;
  };
  const json::parser_callback_t on_event = [&](int /*depth*/, json::parse_event_t event,
                                               json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(stack.size()) >= kMaxJsonDepth) {
          // Where the nesting goes too deep, its first levels (the rest repeats them, mostly).
          std::string where = path_of(stack);
          if (where.size() > 80) where = where.substr(0, 77) + "...";
          throw InputError(file, where,
                           "expected objects and arrays nested at most " +
                               std::to_string(kMaxJsonDepth) + " deep, got deeper");
        }
        stack.push_back(Frame{event == json::parse_event_t::object_start, "", 0, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        element_done();
        break;
      case json::parse_event_t::key: {
        Frame& f = stack.back();
        f.key = parsed.get<std::string>();
        if (duplicates == DuplicateKeys::kRefuse && !f.keys.insert(f.key).second) {
          throw InputError(file, path_of(stack),
                           "duplicate key (each key may appear once per object)");
        }
        break;
      }
      case json::parse_event_t::value:
        element_done();
        break;
    }
    return true;
  };
  try {
    return json::parse(text, on_event);
  } catch (const json::parse_error& e) {
    if (syntax_is_empty) return std::nullopt;
    throw InputError(file, "byte " + std::to_string(e.byte),
                     "expected valid JSON (" + parser_words(e.what()) + ")");
  } catch (const json::out_of_range& e) {
    // 406, "number overflow parsing '1e999'": the only range error the parser raises.
    std::string words = parser_words(e.what());
    const size_t open = words.find('\''), close = words.rfind('\'');
    const std::string number = open != std::string::npos && close > open
                                   ? words.substr(open + 1, close - open - 1)
                                   : words;
    throw InputError(
        file, path_of(stack),
        "expected a number within double's range (magnitude below 1.8e308), got " + number);
  }
}

// The code unit of a \uXXXX escape at text[i] (the backslash), or -1 when it is not one.
int escape_at(const std::string& text, size_t i) {
  if (i + 6 > text.size() || text[i] != '\\' || text[i + 1] != 'u') return -1;
  int v = 0;
  for (size_t k = i + 2; k < i + 6; ++k) {
    const char c = text[k];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

std::string json_replace_lone_surrogates(const std::string& text, int64_t* replaced) {
  if (replaced) *replaced = 0;
  if (text.find("\\u") == std::string::npos) return text;
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i++];
      continue;
    }
    const int u = escape_at(text, i);
    if (u < 0) {  // another escape: copy it whole, so that "\\u..." stays text
      out.append(text, i, 2);
      i += 2;
      continue;
    }
    const bool high = u >= 0xD800 && u <= 0xDBFF, low = u >= 0xDC00 && u <= 0xDFFF;
    const int next = high ? escape_at(text, i + 6) : -1;
    if (high && next >= 0xDC00 && next <= 0xDFFF) {  // a pair
      out.append(text, i, 12);
      i += 12;
    } else if (high || low) {
      out += "\\uFFFD";
      i += 6;
      if (replaced) ++*replaced;
    } else {
      out.append(text, i, 6);
      i += 6;
    }
  }
  return out;
}

json parse_json(const std::string& text, const std::string& file, DuplicateKeys duplicates) {
  return *parse(text, file, duplicates, /*syntax_is_empty=*/false);
}

std::optional<json> parse_json_if_json(const std::string& text, const std::string& file) {
  return parse(text, file, DuplicateKeys::kKeepLast, /*syntax_is_empty=*/true);
}

json read_json_file(const std::string& path, uint64_t max_bytes, DuplicateKeys duplicates) {
  return parse_json(read_input_file(path, max_bytes), path, duplicates);
}

}  // namespace strata
