// tokenizer.h — byte-level BPE (GPT-2, Llama 3), giving exactly the ids of the references.
//
// Two file kinds load into the same tokenizer:
//   - a Hugging Face tokenizer.json: model "BPE" (vocab + merges, merges as "a b" strings or
//     [a, b] lists; ignore_merges honoured), no normalizer, pre_tokenizer ByteLevel (use_regex,
//     add_prefix_space), Split (regex or string pattern; behaviours Isolated, Removed,
//     MergedWithPrevious, MergedWithNext, Contiguous) or a Sequence of those, and added_tokens
//     (lstrip / rstrip honoured; single_word refused). Ids equal
//     tokenizers.Tokenizer.encode(text, add_special_tokens=False): the post-processor's
//     template tokens (Llama 3's <|begin_of_text|>) are never added — the caller adds them.
//   - a tiktoken ranks file (one "<base64 token> <rank>" per line, rank == id; "=" alone is the
//     empty token, as Python's base64 reads it: Whisper's multilingual.tiktoken) with a
//     pre-tokenization pattern: "gpt2" (r50k/p50k; special token <|endoftext|> = number of
//     ranks), "llama3" (Meta's Llama 3 tokenizer.model; its 256 special tokens
//     <|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_0|>, ... from the number of
//     ranks on), "cl100k" (the Llama 3 regex; <|endoftext|>, <|fim_prefix|>, <|fim_middle|>,
//     <|fim_suffix|>, <|endofprompt|> at ranks + 1, 2, 3, 4, 20), or any other string taken as
//     the regex itself (special token <|endoftext|> = number of ranks). Ids equal
//     tiktoken.Encoding(...).encode(text, allowed_special="all").
//
// Rules shared by both:
//   - Input bytes that are not valid UTF-8 are read as Python's
//     bytes.decode("utf-8", errors="replace") reads them: each maximal invalid subpart (Unicode
//     §3.9, "best practice") becomes U+FFFD. Both references take a Python str, so this is
//     what they see for such bytes.
//   - Special (added) tokens in the text are split out first, leftmost-longest, and the text
//     between them is pre-tokenized on its own. For a tokenizer.json, tokens with
//     normalized=false are split out before those with normalized=true (the order Hugging Face
//     uses). tiktoken tries its specials in a regex alternation of unspecified order; that
//     differs from leftmost-longest only if one special token is a prefix of another.
//   - decode() concatenates the bytes of each token, special tokens included (their text); the
//     result may be invalid UTF-8 where a multi-byte character is split across a cut.
//   - Regexes run on PCRE2 with UTF and Unicode properties (PCRE2_UCP; JIT when available).
//     Its \s, \p{L}, \p{N} and (?i) agree with the references' engines (Oniguruma,
//     fancy-regex) on the stress text, U+0085 and U+00A0 included.
//
// Thread-safety: a loaded Tokenizer is immutable; every const method may be called from any
// number of threads at once. Each thread keeps its own cache of pre-token -> ids for the
// tokenizer it used last (512 KiB, fixed: a new pre-token evicts an older one) and its own merge
// buffers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

namespace tokenizer_internal {
struct Model;
}

// Whether the tokenizer file at `path` is a Hugging Face tokenizer.json (its first non-blank
// byte is '{', or its name ends in .json) rather than tiktoken ranks. InputError when unreadable.
bool is_tokenizer_json(const std::string& path);

class Tokenizer {
 public:
  // A Hugging Face tokenizer.json (a file whose first non-blank byte is '{'), or a tiktoken
  // ranks file with `tiktoken_pattern` ("gpt2", "llama3", "cl100k" or a regex; may be empty
  // when the number of ranks names a known encoding: 50256 gpt2, 100256 cl100k, 128000
  // llama3). Throws InputError naming the file and the JSON key or line.
  // `tiktoken_specials`, when given, replaces the pattern's special tokens (text -> id); both
  // are ignored for a tokenizer.json (tiktoken_regex() tells which kind was read).
  static std::unique_ptr<Tokenizer> load(
      const std::string& path, const std::string& tiktoken_pattern = "",
      const std::map<std::string, int32_t>* tiktoken_specials = nullptr);
  // A tiktoken ranks file with a pattern as above and explicit special tokens (text -> id).
  static std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path,
                                                  const std::string& pattern,
                                                  const std::map<std::string, int32_t>& specials);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // One more than the largest id (regular or special).
  int vocab_size() const;
  // Special tokens in text are recognised (see above).
  std::vector<int32_t> encode(std::string_view text) const;
  // Special tokens in text are encoded as plain text (tiktoken's encode_ordinary).
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // encode() of each document, on `threads` threads (<= 1: this thread); same ids as serial.
  // A document encode() refuses rethrows its error here, its index in *failed when given.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& docs, int threads,
                                                 size_t* failed = nullptr) const;
  // encode_ordinary() of each document, as encode_batch.
  std::vector<std::vector<int32_t>> encode_ordinary_batch(const std::vector<std::string>& docs,
                                                          int threads,
                                                          size_t* failed = nullptr) const;
  // The bytes of the tokens, concatenated. Throws InputError for an id that is not a token.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The id of a special token or of a regular token (given as its raw text; for a
  // tokenizer.json also in the byte-level spelling of its vocab, "Ġthe").
  std::optional<int32_t> token_id(const std::string& token) const;
  // The end-of-document token: <|endoftext|>, <|end_of_text|> or </s>, whichever the
  // vocabulary has (in that order).
  std::optional<int32_t> eod_id() const;
  // The file it was loaded from.
  const std::string& path() const;
  // A tiktoken ranks file's pre-tokenization regex (the pattern's, resolved); empty for a
  // tokenizer.json.
  const std::string& tiktoken_regex() const;
  // The special (added) tokens: text -> id.
  std::map<std::string, int32_t> special_tokens() const;
  // A tokenizer read from a tiktoken ranks file, written as a Hugging Face tokenizer.json that
  // gives the same ids (under Strata and under tokenizers / transformers' fast tokenizer):
  // byte-level BPE with every split of a token as a merge at the token's rank and
  // ignore_merges; Split(the pattern's regex, Isolated) then ByteLevel(use_regex false); the
  // special tokens as added tokens. transformers' TikTokenConverter builds the same. InputError
  // for a tokenizer read from a tokenizer.json.
  std::string hf_tokenizer_json() const;

 private:
  explicit Tokenizer(std::unique_ptr<tokenizer_internal::Model> model);
  std::vector<std::vector<int32_t>> batch(const std::vector<std::string>& docs, int threads,
                                          size_t* failed, bool special) const;
  std::unique_ptr<tokenizer_internal::Model> m_;
};

// The number of maximal invalid UTF-8 subparts in `text`: each is one U+FFFD in what encode()
// reads (see above). *first, when given and the count is not 0, is the byte offset of the first.
int64_t count_invalid_utf8(std::string_view text, size_t* first = nullptr);

// Token ids written as text, "1,2,3" (decimal, comma-separated, no spaces): into *ids, false when
// `text` is not that form (prompts given as ids: strata generate, log.sample_prompt).
bool parse_token_ids(const std::string& text, std::vector<int32_t>* ids);

}  // namespace strata
