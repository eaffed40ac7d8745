#include "launch/commands/data.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "runtime/base/error.h"
#include "runtime/base/operation.h"
#include "runtime/data/binary_io.h"
#include "runtime/data/indexed.h"
#include "runtime/data/token_shards.h"
#include "runtime/data/tokenizer.h"
#include "runtime/io/input_file.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

const char kUsage[] =
    "usage: strata data prepare --tokenizer FILE --input FILE... --output PREFIX\n"
    "                           [--format megatron|llmc] [--json-key KEY]\n"
    "                           [--documents file|paragraphs] [--threads N] [--no-eod]\n"
    "                           [--shard-tokens N] [--allow-special]\n"
    "                           [--pattern gpt2|cl100k|llama3|REGEX] [--special NAME=ID ...]\n"
    "  Tokenizes text or JSON Lines into a dataset for data.source \"indexed\" or \"tokens\".\n"
    "  --tokenizer FILE   a Hugging Face tokenizer.json or a tiktoken ranks file\n"
    "  --input FILE...    .jsonl/.json: one document per line (its KEY field, default \"text\");\n"
    "                     any other file: UTF-8 text, one document per file (or per paragraph)\n"
    "  --output PREFIX    megatron: PREFIX.idx + PREFIX.bin; llmc: PREFIX_000000.bin, ...\n"
    "                     (its folder is made when missing)\n"
    "  --format F         megatron (default, Megatron-LM's indexed dataset: the end token after\n"
    "                     each document) or llmc (llm.c's shards: the end token before each)\n"
    "  --documents D      text inputs: file (default) or paragraphs (split at blank lines)\n"
    "  --threads N        tokenizer threads (default: the cores)\n"
    "  --no-eod           no end-of-document token\n"
    "  --shard-tokens N   llmc: tokens per shard (default 100000000)\n"
    "  --allow-special    special tokens written in a document (<|endoftext|>) become their\n"
    "                     ids; by default they are text, as tiktoken's encode_ordinary reads them\n"
    "  --pattern P        tiktoken file: its pre-tokenization pattern, gpt2, cl100k, llama3 or a\n"
    "                     regex (default: the one its rank count names: 50256, 100256, 128000)\n"
    "  --special NAME=ID  tiktoken file: a special token (repeatable); together they replace\n"
    "                     the pattern's special tokens\n"
    "  Invalid UTF-8 in a text input is read as U+FFFD (counted in the summary).\n"
    "\n"
    "usage: strata data convert --tokenizer FILE --output PATH\n"
    "                           [--pattern gpt2|cl100k|llama3|REGEX] [--special NAME=ID ...]\n"
    "  Writes a tiktoken ranks file as a Hugging Face tokenizer.json that gives the same ids\n"
    "  under Strata, tokenizers and transformers' fast tokenizer (byte-level BPE: every split\n"
    "  of a token into two tokens is a merge at the token's rank, ignore_merges; the pattern's\n"
    "  regex as a Split; the special tokens as added tokens), as transformers'\n"
    "  TikTokenConverter builds it. strata export does this for a run's tiktoken file.\n"
    "  --tokenizer FILE   a tiktoken ranks file\n"
    "  --output PATH      the tokenizer.json to write (its folder is made when missing)\n"
    "  --pattern, --special  as for prepare\n";

struct Options {
  std::string tokenizer, output, format = "megatron", json_key = "text", documents = "file";
  std::vector<std::string> inputs;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool eod = true;
  int64_t shard_tokens = 100000000;
  bool allow_special = false;
  std::string pattern;                      // tiktoken files: "" = from the rank count
  std::map<std::string, int32_t> specials;  // tiktoken files: replaces the pattern's
};

[[noreturn]] void bad(const std::string& flag, const std::string& expected,
                      const std::string& sub = "prepare") {
  throw InputError("<command line>", flag, expected + " (see strata data " + sub + " --help)");
}

int64_t positive(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const long long n = std::stoll(v, &used);
    if (used == v.size() && n > 0) return n;
  } catch (const std::exception&) {
  }
  bad(flag, "a positive integer, got \"" + v + "\"");
}

// The options of `strata data SUB` (prepare, or convert: --tokenizer, --output, --pattern and
// --special alone).
Options parse(const std::vector<std::string>& args, const std::string& sub = "prepare") {
  Options o;
  const bool convert = sub == "convert";
  const auto bad = [&sub](const std::string& flag, const std::string& expected) {
    strata::bad(flag, expected, sub);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) bad(a, "a value after " + a);
      return args[++i];
    };
    if (convert && a != "--tokenizer" && a != "--output" && a != "--pattern" && a != "--special")
      bad(a, "an option of strata data convert: --tokenizer, --output, --pattern or --special");
    if (a == "--tokenizer") {
      o.tokenizer = value();
    } else if (a == "--output") {
      o.output = value();
    } else if (a == "--format") {
      o.format = value();
      if (o.format != "megatron" && o.format != "llmc") bad(a, "megatron or llmc, got " + o.format);
    } else if (a == "--json-key") {
      o.json_key = value();
    } else if (a == "--documents") {
      o.documents = value();
      if (o.documents != "file" && o.documents != "paragraphs")
        bad(a, "file or paragraphs, got " + o.documents);
    } else if (a == "--threads") {
      o.threads = static_cast<int>(positive(a, value()));
    } else if (a == "--shard-tokens") {
      o.shard_tokens = positive(a, value());
    } else if (a == "--no-eod") {
      o.eod = false;
    } else if (a == "--allow-special") {
      o.allow_special = true;
    } else if (a == "--pattern") {
      o.pattern = value();
      if (o.pattern.empty()) bad(a, "gpt2, cl100k, llama3 or a regex, got an empty pattern");
    } else if (a == "--special") {
      const std::string& v = value();
      const size_t eq = v.rfind('=');
      const std::string name = eq == std::string::npos ? "" : v.substr(0, eq);
      const std::string id = eq == std::string::npos ? "" : v.substr(eq + 1);
      if (name.empty() || id.empty() || id.size() > 7 ||
          id.find_first_not_of("0123456789") != std::string::npos || std::stoll(id) > 4194303)
        bad(a, "NAME=ID, a token's text and an id in 0..4194303, got \"" + v + "\"");
      if (!o.specials.emplace(name, static_cast<int32_t>(std::stoll(id))).second)
        bad(a, "each NAME once, got \"" + name + "\" twice");
    } else if (a == "--input") {
      o.inputs.push_back(value());
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) o.inputs.push_back(args[++i]);
    } else {
      bad(a, "an option of strata data prepare");
    }
  }
  if (o.tokenizer.empty())
    bad("--tokenizer", convert ? "a tiktoken ranks file" : "a tokenizer file");
  if (o.inputs.empty() && !convert) bad("--input", "one or more input files");
  if (o.output.empty()) bad("--output", convert ? "a tokenizer.json path" : "an output prefix");
  return o;
}

bool is_json_lines(const std::string& path) {
  auto ends = [&](const char* s) {
    const std::string x(s);
    return path.size() >= x.size() && path.compare(path.size() - x.size(), x.size(), x) == 0;
  };
  return ends(".jsonl") || ends(".json");
}

// Where the tokens go: one indexed dataset, or llm.c shards.
class Sink {
 public:
  Sink(const Options& o, int token_bytes) : o_(o), token_bytes_(token_bytes) {
    if (o.format == "megatron")
      indexed_ = std::make_unique<IndexedDatasetWriter>(o.output, token_bytes);
  }
  void add(const std::vector<int32_t>& doc) {
    if (indexed_) {
      indexed_->add_document(doc.data(), static_cast<int64_t>(doc.size()));
      return;
    }
    for (int32_t t : doc) {
      shard_.push_back(t);
      if (static_cast<int64_t>(shard_.size()) == o_.shard_tokens) flush();
    }
  }
  // Finishes the outputs; returns what was written. The shards are written under temporary
  // names and published together, here: an earlier run's shards of the prefix that this one does
  // not replace (a larger run's tail, which the glob would still match) are removed first; a run
  // that fails (a full disk) publishes none.
  std::string finish() {
    if (indexed_) {
      indexed_->finish();
      return o_.output + ".idx + .bin";
    }
    if (!shard_.empty() || shards_ == 0) flush();
    for (const auto& f : written_) f->check_destination();
    remove_stale_shards();
    for (const auto& f : written_) f->rename();
    written_.clear();
    return std::to_string(shards_) + " shard(s) " + o_.output + "_*.bin";
  }

 private:
  std::string shard_path(int k) const {
    char name[32];
    std::snprintf(name, sizeof name, "_%06d.bin", k);
    return o_.output + name;
  }
  void flush() {
    written_.push_back(write_token_shard_unpublished(
        shard_path(shards_++), shard_.data(), static_cast<int64_t>(shard_.size()), token_bytes_));
    shard_.clear();
  }
  // PREFIX_NNNNNN.bin files past the ones this run writes.
  void remove_stale_shards() const {
    namespace fs = std::filesystem;
    const fs::path prefix(o_.output);
    const fs::path dir = prefix.has_parent_path() ? prefix.parent_path() : fs::path(".");
    const std::string stem = prefix.filename().string() + "_";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() != stem.size() + 10 || name.compare(0, stem.size(), stem) != 0 ||
          name.compare(name.size() - 4, 4, ".bin") != 0)
        continue;
      const std::string digits = name.substr(stem.size(), 6);
      if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
      if (std::stoi(digits) >= shards_) fs::remove(e.path(), ec);
    }
  }

  const Options& o_;
  int token_bytes_;
  std::unique_ptr<IndexedDatasetWriter> indexed_;
  std::vector<int32_t> shard_;
  int shards_ = 0;
  std::vector<std::unique_ptr<binary_io::AtomicFile>> written_;  // complete, not yet published
};

int prepare(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  const Options o = parse(args);
  // Every input is checked before the first is read, so that a bad one leaves no output.
  for (const std::string& path : o.inputs) check_input_file(path, kMaxTextFileBytes);
  const std::unique_ptr<Tokenizer> tok =
      with_memory_named({"loading the tokenizer", o.tokenizer, ""}, [&] {
        return Tokenizer::load(o.tokenizer, o.pattern, o.specials.empty() ? nullptr : &o.specials);
      });
  if (tok->tiktoken_regex().empty() && (!o.pattern.empty() || !o.specials.empty()))
    bad(o.pattern.empty() ? "--special" : "--pattern",
        "a tiktoken ranks file as --tokenizer (" + o.tokenizer +
            " is a tokenizer.json: its pattern and special tokens are its own)");
  std::optional<int32_t> eod;
  if (o.eod) {
    eod = tok->eod_id();
    if (!eod)
      throw InputError(o.tokenizer, "added_tokens",
                       "an end-of-document token (<|endoftext|>, <|end_of_text|> or </s>), or "
                       "--no-eod");
  }
  const int token_bytes = optimal_token_bytes(tok->vocab_size());
  // The output's folder is made when missing (mkdir -p), once every input has been checked.
  const std::string folder = std::filesystem::path(o.output).parent_path().string();
  if (!folder.empty())
    if (const std::string problem = output_directory_problem(folder); !problem.empty())
      bad("--output", "a prefix whose folder exists or can be made: " + folder + ": " + problem);
  Sink sink(o, token_bytes);

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last_report = t0;
  int64_t documents = 0, tokens = 0, bytes = 0, surrogates = 0, invalid_utf8 = 0;
  // The inputs' size, for the progress line's share and ETA.
  double input_bytes = 0;
  for (const std::string& path : o.inputs) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec) input_bytes += static_cast<double>(size);
  }
  std::string first_invalid;  // where the first invalid UTF-8 sequence is
  std::vector<std::string> batch;
  std::vector<std::pair<std::string, std::string>> origin;  // [document] (input file, where)
  size_t batch_bytes = 0;
  auto flush = [&] {
    std::vector<std::vector<int32_t>> encoded;
    size_t failed = 0;
    try {
      encoded = o.allow_special ? tok->encode_batch(batch, o.threads, &failed)
                                : tok->encode_ordinary_batch(batch, o.threads, &failed);
    } catch (const InputError& e) {
      // The tokenizer refuses a document (its pattern gives up on it): name both.
      const auto& [file, where] = origin.at(failed);
      throw InputError(file, where,
                       "text the tokenizer can split; its pre-tokenizer pattern (" + e.file() +
                           ": " + e.where() + ") cannot: " + e.expected());
    }
    origin.clear();
    for (std::vector<int32_t>& ids : encoded) {
      // llm.c's fineweb.py starts each document with the end token (so the stream begins with
      // one); Megatron's preprocess_data.py appends it.
      if (eod && o.format == "llmc") ids.insert(ids.begin(), *eod);
      if (eod && o.format != "llmc") ids.push_back(*eod);
      tokens += static_cast<int64_t>(ids.size());
      sink.add(ids);
      ++documents;
    }
    batch.clear();
    batch_bytes = 0;
    const auto now = Clock::now();
    if (now - last_report > std::chrono::seconds(2)) {
      const double s = std::chrono::duration<double>(now - t0).count();
      // The share of the inputs' bytes read as documents: JSON Lines' keys and escapes are not
      // counted, so it runs a little behind and the ETA a little long there.
      const double done = input_bytes > 0 ? std::min(0.99, double(bytes) / input_bytes) : 0;
      const double rate = static_cast<double>(bytes) / s;
      std::fprintf(stderr,
                   "  %lld documents, %lld tokens, %.1f MB read, %.1f MB/s, ~%.0f%%, ETA %.0f s\n",
                   static_cast<long long>(documents), static_cast<long long>(tokens),
                   static_cast<double>(bytes) / 1e6, rate / 1e6, 100.0 * done,
                   rate > 0 ? (input_bytes - static_cast<double>(bytes)) / rate : 0.0);
      last_report = now;
    }
  };
  // `offset`: the document's first byte in its file (text inputs), or -1 (JSON Lines).
  auto add = [&](std::string doc, const std::string& file, const std::string& where,
                 int64_t offset) {
    size_t first = 0;
    const int64_t invalid = count_invalid_utf8(doc, &first);
    if (invalid > 0 && invalid_utf8 == 0)
      first_invalid = file + ": " +
                      (offset >= 0 ? "byte " + std::to_string(offset + static_cast<int64_t>(first))
                                   : where + ", byte " + std::to_string(first) + " of its text");
    invalid_utf8 += invalid;
    origin.emplace_back(file, where);
    bytes += static_cast<int64_t>(doc.size());
    batch_bytes += doc.size();
    batch.push_back(std::move(doc));
    if (batch_bytes > (size_t{8} << 20)) flush();
  };
  // One input's documents: a line or document too large for this process names its file.
  auto read_input = [&](const std::string& path) {
    if (is_json_lines(path)) {
      std::ifstream in(path, std::ios::binary);
      if (!in) throw InputError(path, "", "a readable input file");
      std::string line;
      for (int64_t n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string at = "line " + std::to_string(n);
        // A lone surrogate escape is U+FFFD, as Python's json and tiktoken read it; nesting is
        // bounded as the config reader's (a line of 50 MB of '[' took 4 GB to refuse).
        int64_t replaced = 0;
        std::optional<nlohmann::json> j;
        try {
          j = parse_json_if_json(json_replace_lone_surrogates(line, &replaced), path);
        } catch (const InputError& e) {
          throw InputError(path, at + (e.where().empty() ? "" : ": " + e.where()), e.expected());
        }
        surrogates += replaced;
        if (!j || !j->is_object() || !j->contains(o.json_key) || !(*j)[o.json_key].is_string())
          throw InputError(path, at, "a JSON object with a string \"" + o.json_key + "\"");
        add((*j)[o.json_key].get<std::string>(), path, at, -1);
      }
      return;
    }
    std::string text = read_input_file(path, kMaxTextFileBytes);
    if (o.documents == "file") {
      add(std::move(text), path, "", 0);
      return;
    }
    // Paragraphs: runs of lines between blank lines, each keeping its final newline.
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find("\n\n", start);
      end = end == std::string::npos ? text.size() : end + 1;
      if (text.find_first_not_of("\n", start) < end)
        add(text.substr(start, end - start), path, "byte " + std::to_string(start),
            static_cast<int64_t>(start));
      start = text.find_first_not_of('\n', end);
      if (start == std::string::npos) break;
    }
  };
  for (const std::string& path : o.inputs)
    with_memory_named({"reading and tokenizing " + path, path, ""}, [&] { read_input(path); });
  flush();
  if (documents == 0) throw InputError(o.inputs.front(), "", "at least one document in the inputs");
  const std::string written = sink.finish();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "prepared %lld documents, %lld tokens (%s) from %.1f MB in %.2f s (%.1f MB/s, %d "
      "threads) -> %s\n",
      static_cast<long long>(documents), static_cast<long long>(tokens),
      token_bytes == 2 ? "uint16" : "int32", static_cast<double>(bytes) / 1e6, s,
      static_cast<double>(bytes) / 1e6 / s, o.threads, written.c_str());
  if (invalid_utf8 > 0)
    std::printf("  %lld invalid UTF-8 sequence(s) read as U+FFFD (the first at %s)\n",
                static_cast<long long>(invalid_utf8), first_invalid.c_str());
  if (surrogates > 0)
    std::printf("  %lld lone surrogate escape(s) in the JSON read as U+FFFD\n",
                static_cast<long long>(surrogates));
  // What a training config needs beside the data: ids run below the tokenizer's vocabulary,
  // which Megatron pads to a multiple of 128 for the embedding's GEMMs.
  const int vocab = tok->vocab_size();
  std::printf(
      "  vocabulary %d ids: model.vocab_size at least %d (%d, the next multiple of 128, "
      "as Megatron pads it)\n",
      vocab, vocab, (vocab + 127) / 128 * 128);
  return 0;
}

int convert(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  const Options o = parse(args, "convert");
  const std::unique_ptr<Tokenizer> tok =
      with_memory_named({"loading the tokenizer", o.tokenizer, ""}, [&] {
        return Tokenizer::load(o.tokenizer, o.pattern, o.specials.empty() ? nullptr : &o.specials);
      });
  if (tok->tiktoken_regex().empty())
    bad("--tokenizer", "a tiktoken ranks file (" + o.tokenizer + " is a tokenizer.json already)",
        "convert");
  const std::string folder = std::filesystem::path(o.output).parent_path().string();
  if (!folder.empty())
    if (const std::string problem = output_directory_problem(folder); !problem.empty())
      bad("--output", "a path whose folder exists or can be made: " + folder + ": " + problem,
          "convert");
  const std::string text = tok->hf_tokenizer_json();
  binary_io::AtomicFile out(o.output);
  out.write(text.data(), text.size());
  out.close();
  out.check_destination();
  out.rename();
  std::printf("tokenizer.json: %s (%d tokens, %zu special; from %s)\n", o.output.c_str(),
              tok->vocab_size(), tok->special_tokens().size(), o.tokenizer.c_str());
  return 0;
}

}  // namespace

int cmd_data(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "prepare") return prepare({args.begin() + 1, args.end()});
  if (args[0] == "convert") return convert({args.begin() + 1, args.end()});
  throw InputError("<command line>", args[0],
                   "a data subcommand: prepare or convert (strata data --help)");
}

}  // namespace strata
