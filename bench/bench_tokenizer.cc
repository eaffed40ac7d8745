// bench_tokenizer — Strata's tokenizer encode throughput (MB/s) beside tiktoken's, on real text
// and on words that do not repeat.
//
// Two corpora, each cut into documents at blank lines (the cut bench/tokenizer_compare.py makes
// for tiktoken and Hugging Face tokenizers) and encoded with encode_batch on each thread count:
//   text    the file TEXT, repeated --repeat times (left out when no TEXT is given);
//   unique  --unique-mb MB of random lowercase words of 5 to 12 letters, 200 to a paragraph,
//           from a fixed seed: every run and machine gets the same bytes, and almost no word
//           repeats, so a pre-token cache never hits and every piece is merged.
// Each run loads the tokenizer afresh, so its pre-token cache starts cold (it warms within the
// run, as a real data-preparation run's does). Prints the best of --runs runs per corpus and
// thread count, one line each:
//     strata corpus=text threads=1 mb_per_s=52.1 seconds=0.021 ids=341143 bytes=1115394
// then, for a tiktoken ranks file, tiktoken's figures on the same documents measured in the same
// run by a `python3` child (--python names another interpreter): Encoding(ranks, the file's
// pattern, its special tokens).encode_batch(docs, num_threads=N, allowed_special="all"), a fresh
// Encoding per run; "tiktoken not installed" when the interpreter cannot import it. The ratio
// line says whether both gave the same number of ids. MB = 10^6 bytes of input text. Never
// fails on time.
//
// usage: bench_tokenizer TOKENIZER [TEXT] [--pattern P] [--repeat N] [--threads 1,2] [--runs R]
//                        [--unique-mb M] [--python PY] [--compare tiktoken|none]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/base/error.h"
#include "runtime/data/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split_documents(const std::string& text) {
  std::vector<std::string> docs;
  for (size_t from = 0; from < text.size();) {
    size_t to = text.find("\n\n", from);
    to = to == std::string::npos ? text.size() : to + 2;
    docs.push_back(text.substr(from, to - from));
    from = to;
  }
  return docs;
}

// Random words from a fixed seed (splitmix64): `bytes` bytes or a little more.
std::string unique_words(size_t bytes) {
  uint64_t state = 0x5EED0001u;
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::string text;
  text.reserve(bytes + 4096);
  while (text.size() < bytes) {
    for (int w = 0; w < 200; ++w) {
      if (w > 0) text += ' ';
      const int len = 5 + static_cast<int>(next() % 8);
      for (int k = 0; k < len; ++k) text += static_cast<char>('a' + next() % 26);
    }
    text += ".\n\n";
  }
  return text;
}

// The child that times tiktoken: argv[1] is a JSON file {ranks, regex, specials, text, repeat,
// threads, runs, bench_dir (whose tokenizer_compare.py reads the ranks and cuts the documents)};
// prints "THREADS SECONDS IDS" per thread count, or one line saying why not.
constexpr const char* kTiktokenChild = R"PY(
import json, sys, time
cfg = json.load(open(sys.argv[1]))
try:
    import tiktoken
except ImportError:
    print("tiktoken not installed")
    sys.exit(0)
sys.path.insert(0, cfg["bench_dir"])
from tokenizer_compare import documents, read_ranks  # the cut tokenizer_compare.py makes
ranks = read_ranks(cfg["ranks"])
docs, _ = documents(cfg["text"], cfg["repeat"])
for threads in cfg["threads"]:
    best, ids = 1e30, 0
    for _ in range(cfg["runs"]):
        enc = tiktoken.Encoding("bench", pat_str=cfg["regex"], mergeable_ranks=ranks,
                                special_tokens=cfg["specials"])
        t0 = time.perf_counter()
        out = enc.encode_batch(docs, num_threads=threads, allowed_special="all")
        best = min(best, time.perf_counter() - t0)
        ids = sum(len(o) for o in out)
    print(threads, best, ids, flush=True)
)PY";

std::string temp_file(const std::string& suffix, const std::string& contents) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                     "/bench_tokenizer_XXXXXX" + suffix;
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  const int fd = mkstemps(buf.data(), static_cast<int>(suffix.size()));
  if (fd < 0) return "";
  const bool ok =
      write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
  close(fd);
  path.assign(buf.data());
  if (!ok) {
    std::remove(path.c_str());
    return "";
  }
  return path;
}

struct Figure {
  double seconds = 0;
  size_t ids = 0;
};

// tiktoken's figures per thread count, or an empty map with *why set.
std::map<int, Figure> run_tiktoken(const std::string& python, const strata::Tokenizer& tok,
                                   const std::string& text_path, int repeat,
                                   const std::vector<int>& threads, int runs, std::string* why) {
  std::map<int, Figure> out;
  nlohmann::json cfg = {{"ranks", tok.path()},
                        {"regex", tok.tiktoken_regex()},
                        {"specials", tok.special_tokens()},
                        {"text", text_path},
                        {"repeat", repeat},
                        {"threads", threads},
                        {"runs", runs},
                        {"bench_dir", STRATA_BENCH_DIR}};
  const std::string script = temp_file(".py", kTiktokenChild);
  const std::string config = temp_file(".json", cfg.dump());
  if (script.empty() || config.empty()) {
    *why = "tiktoken not run (no temporary file)";
  } else {
    const std::string cmd = "'" + python + "' '" + script + "' '" + config + "' 2>&1";
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char line[4096];
      std::string last;
      while (std::fgets(line, sizeof line, p) != nullptr) {
        int t = 0;
        double s = 0;
        unsigned long long ids = 0;
        if (std::sscanf(line, "%d %lf %llu", &t, &s, &ids) == 3) {
          out[t] = Figure{s, static_cast<size_t>(ids)};
        } else {
          last = line;
          while (!last.empty() && (last.back() == '\n' || last.back() == '\r')) last.pop_back();
        }
      }
      const int status = pclose(p);
      if (out.empty()) {
        if (last == "tiktoken not installed") {
          *why = last;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
          *why = "tiktoken not installed (no " + python + ")";
        } else {
          *why = "tiktoken failed: " + last;
        }
      }
    } else {
      *why = "tiktoken not run (popen failed)";
    }
  }
  if (!script.empty()) std::remove(script.c_str());
  if (!config.empty()) std::remove(config.c_str());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: bench_tokenizer TOKENIZER [TEXT] [--pattern P] [--repeat N] [--threads 1,2] "
      "[--runs R] [--unique-mb M] [--python PY] [--compare tiktoken|none]\n";
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "%s", usage);
    return 2;
  }
  const std::string tok_path = argv[1];
  int first_option = 2;
  std::string text_path;
  if (argc > 2 && argv[2][0] != '-') text_path = argv[2], first_option = 3;
  std::string pattern, python = "python3", compare = "tiktoken";
  int repeat = 1, runs = 3;
  double unique_mb = 8;
  std::vector<int> threads = {1, 2};
  for (int i = first_option; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n%s", k.c_str(), usage);
      return 2;
    }
    const std::string v = argv[i + 1];
    if (k == "--pattern") {
      pattern = v;
    } else if (k == "--repeat") {
      repeat = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--runs") {
      runs = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--unique-mb") {
      unique_mb = std::atof(v.c_str());
    } else if (k == "--python") {
      python = v;
    } else if (k == "--compare" && (v == "tiktoken" || v == "none")) {
      compare = v;
    } else if (k == "--threads") {
      threads.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) threads.push_back(std::atoi(t.c_str()));
    } else {
      std::fprintf(stderr, "unknown option %s\n%s", k.c_str(), usage);
      return 2;
    }
  }
  try {
    struct Corpus {
      std::string name, path, text, note;
      int repeat = 1;
    };
    std::vector<Corpus> corpora;
    if (!text_path.empty()) {
      std::ifstream in(text_path, std::ios::binary);
      if (!in) throw strata::InputError(text_path, "", "a readable text file");
      std::stringstream ss;
      ss << in.rdbuf();
      Corpus c{"text", text_path, "", text_path + " x" + std::to_string(repeat), repeat};
      for (int r = 0; r < repeat; ++r) c.text += ss.str();
      corpora.push_back(std::move(c));
    }
    std::string unique_path;
    if (unique_mb > 0) {
      Corpus c{"unique", "", unique_words(static_cast<size_t>(unique_mb * 1e6)),
               "random words, generated", 1};
      if (compare == "tiktoken") c.path = unique_path = temp_file(".txt", c.text);
      corpora.push_back(std::move(c));
    }
    for (const Corpus& c : corpora) {
      const std::vector<std::string> docs = split_documents(c.text);
      std::printf("# %s: corpus %s (%s): %zu bytes, %zu documents\n", tok_path.c_str(),
                  c.name.c_str(), c.note.c_str(), c.text.size(), docs.size());
      std::map<int, Figure> ours;
      for (int t : threads) {
        Figure best{1e30, 0};
        for (int r = 0; r < runs; ++r) {
          const auto tok = strata::Tokenizer::load(tok_path, pattern);  // a cold cache
          const auto t0 = Clock::now();
          const auto out = tok->encode_batch(docs, t);
          best.seconds =
              std::min(best.seconds, std::chrono::duration<double>(Clock::now() - t0).count());
          best.ids = 0;
          for (const auto& d : out) best.ids += d.size();
        }
        ours[t] = best;
        std::printf("strata corpus=%s threads=%d mb_per_s=%.1f seconds=%.4f ids=%zu bytes=%zu\n",
                    c.name.c_str(), t, c.text.size() / best.seconds / 1e6, best.seconds, best.ids,
                    c.text.size());
        std::fflush(stdout);
      }
      if (compare != "tiktoken") continue;
      const auto tok = strata::Tokenizer::load(tok_path, pattern);
      if (tok->tiktoken_regex().empty()) {
        std::printf("tiktoken: not comparable (a tokenizer.json, not a tiktoken ranks file)\n");
        continue;
      }
      if (c.path.empty()) {
        std::printf("tiktoken not run (no temporary file for the corpus)\n");
        continue;
      }
      std::string why;
      const std::map<int, Figure> theirs =
          run_tiktoken(python, *tok, c.path, c.repeat, threads, runs, &why);
      if (theirs.empty()) {
        std::printf("%s\n", why.c_str());
        continue;
      }
      for (const auto& [t, f] : theirs) {
        std::printf("tiktoken corpus=%s threads=%d mb_per_s=%.1f seconds=%.4f ids=%zu bytes=%zu\n",
                    c.name.c_str(), t, c.text.size() / f.seconds / 1e6, f.seconds, f.ids,
                    c.text.size());
      }
      std::printf("# %s: strata / tiktoken", c.name.c_str());
      bool same = true;
      for (const auto& [t, f] : theirs) {
        std::printf(" %.2fx (%d thread%s)", f.seconds / ours[t].seconds, t, t == 1 ? "" : "s");
        same = same && f.ids == ours[t].ids;
      }
      std::printf("; ids: %s\n", same ? "same count" : "DIFFERENT counts");
    }
    if (!unique_path.empty()) std::remove(unique_path.c_str());
  } catch (const strata::InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
