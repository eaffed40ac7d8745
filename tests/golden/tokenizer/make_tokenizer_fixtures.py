#!/usr/bin/env python3
"""Generate the golden fixtures of Strata's byte-level BPE tokenizer (tests/test_tokenizer.cc).

Two tokenizers are trained with the Hugging Face `tokenizers` package on tinyshakespeare (4096
merges over the 256 byte-level symbols):

  gpt2_style    ByteLevel pre-tokenizer with GPT-2's regex; <|endoftext|> added after the merges.
  llama3_style  Sequence[Split(Llama 3's regex, "Isolated"), ByteLevel(use_regex=False)], as Meta's
                Llama 3 tokenizer.json has it; Meta's 256 special tokens (<|begin_of_text|>,
                <|end_of_text|>, <|reserved_special_token_0|>, ...) added after the merges.

Each is written as a Hugging Face tokenizer.json (gpt2_style with merges as "a b" strings,
llama3_style with merges as [a, b] lists, the two forms tokenizers writes) and as a tiktoken ranks
file (base64 token, space, rank; rank == id), whose special tokens follow the ranks exactly where
Strata's built-in patterns "gpt2" and "llama3" put them.

Golden ids come from both references -- tokenizers.Tokenizer.encode(add_special_tokens=False) and
tiktoken.Encoding(same ranks, same regex).encode(allowed_special="all") -- and the script fails if
they differ anywhere. Inputs:

  stress.txt          committed Unicode stress text (written by this script)
  stress_invalid.bin  committed bytes with invalid UTF-8; the references see
                      bytes.decode("utf-8", errors="replace"), which is what Strata is defined to do
  tinyshakespeare     the whole corpus (../shared/data/tinyshakespeare.txt beside the checkout)

Outputs (in this folder): <tok>.tokenizer.json, <tok>.tiktoken, and the ids as little-endian
uint32 (<tok>.stress.ids, <tok>.stress_invalid.ids) and uint16 (<tok>.corpus.ids, the corpus),
plus golden.json with counts and the corpus's sha256 (the test skips the corpus check if the
shared corpus is absent or differs).

Usage: /work/venv-hf/bin/python tests/golden/tokenizer/make_tokenizer_fixtures.py [--corpus PATH]
Needs tokenizers and tiktoken; deterministic for a given tokenizers version (recorded in golden.json).
"""
import argparse
import base64
import hashlib
import json
import os
import struct
import sys

import tiktoken
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_MERGES = 4096

# GPT-2's pre-tokenization regex (what tokenizers' ByteLevel(use_regex=True) applies).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Llama 3's (Meta's tokenizer.py pat_str and the Split of Meta's tokenizer.json).
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>"] +
                   [f"<|reserved_special_token_{i}|>" for i in range(4)] +
                   ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>",
                    "<|eot_id|>"] + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])

# The Unicode stress text. Each line exercises something the regexes or the merges treat
# specially; special tokens appear inside words and at line ends.
STRESS_LINES = [
    "Hello world! HELLO WORLD? hello, world... First Citizen:",
    "Contractions: it's don't we're they've I'm you'll he'd IT'S DON'T WE'RE THEY'VE I'M YOU'LL HE'D",
    "Mixed case: It'S dOn'T We'Re ThEy'Ve i'M yOu'Ll hE'd; quotes 'tis 'twas o'clock rock'n'roll ''s",
    "Long s: 'ſ 'ſt ſtrength; Kelvin: 'K",
    "Digits: 1 12 123 1234 12345 123456 3.14159 1,000,000 2024-05-20 ٣٤٥ ໑໒໓ ①②③ Ⅻ ¼½",
    "Whitespace:  two  spaces   three    four\ttab\t\ttabs \t mixed\u00a0nbsp\u00a0\u00a0two nbsp",
    "Odd spaces:\u2003em\u2009thin\u3000ideographic\u200bzwsp\u0085nel\u2028ls\u2029ps end",
    "trailing spaces   ",
    "\t\tleading tabs and a blank line follows",
    "",
    "   ",
    "CRLF line\r\nand lone CR\rand LF\n\nand blank lines",
    "CJK: 你好，世界！我们在测试分词器。日本語のテキストとカタカナ。한국어 텍스트입니다.",
    "Emoji: 😀 😀😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇩🇪 ❤️ 🧑🏿‍💻 a😀b",
    "Combining: e\u0301 a\u0300\u0301\u0302 n\u0303 Z\u0351\u0352\u0353alg\u0300o \u0915\u094d\u0937 "
    "\u0e01\u0e33",
    "Scripts: Ελληνικά Русский עברית العربية हिन्दी ไทย ქართული Ωmega µ ß ẞ ǅ",
    "Symbols: @#$%^&*()_+-=[]{}|;:,.<>/?`~ «» „“ — – … € £ ¥ © ® ™ → ← ∑ ∫ ≠ ≤",
    "Specials: a<|endoftext|>b <|endoftext|> <|end_of_text|>x<|begin_of_text|> <|eot_id|>\n"
    "<|endoftext|><|endoftext|>  <|endoftext|>\n<|reserved_special_token_7|> <|notspecial|> <|endof",
    "Long words: Pneumonoultramicroscopicsilicovolcanoconiosis "
    "supercalifragilisticexpialidocious " + "ab" * 150 + " " + "x" * 300 + " " + "9" * 100,
    "Punctuation runs: !!!??? ... --- ***  ,,,,;;;; ''''  \"\"\"\" ((((]]]]",
    "URL https://example.com/path?q=1&r=2#frag email a.b+c@d.org path C:\\Users\\x",
    "Code: def f(x):\n    return x**2  # comment\n\tif (a && b) { c++; }\n",
    "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is "
    "the sun.",
]
STRESS_TEXT = "\n".join(STRESS_LINES) + "\n\n\n"

# Invalid UTF-8 of every kind Python's "replace" handler treats differently: lone continuation
# bytes, truncated sequences (one U+FFFD per maximal subpart), overlongs, surrogates, code points
# beyond U+10FFFF, 0xFE/0xFF, and a truncated sequence at the very end.
STRESS_INVALID = (b"valid start \x80 lone cont \xbf\xbf two conts \xc3 truncated2 "
                  b"\xe2\x82 truncated3 \xf0\x9f\x98 truncated4 \xc0\xaf overlong \xe0\x80\xaf "
                  b"overlong3 \xed\xa0\x80 surrogate \xf4\x90\x80\x80 beyond \xfe\xff bytes "
                  b"\xf8\x88\x80\x80\x80 five \xe2\x82\xac euro ok \xe2\x82x mid \xc3\xa9t\xc3 "
                  b"word\xffword <|endoftext|>\xe2<|endoftext|> \xf0\x9f\x98\x80 ok \xe4\xbd")


def train(pre_tokenizer, path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + NUM_MERGES, initial_alphabet=alphabet,
                                  show_progress=False, min_frequency=2)
    tok.train([path], trainer)
    return tok


def byte_decoder():
    # GPT-2's bytes_to_unicode, inverted: byte-level symbol -> byte.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def ranks_of(tok):
    dec = byte_decoder()
    vocab = json.loads(tok.to_str())["model"]["vocab"]
    ranks = {bytes(dec[ch] for ch in s): i for s, i in vocab.items()}
    assert len(ranks) == len(vocab) and sorted(ranks.values()) == list(range(len(ranks)))
    return ranks


def write_ids(path, ids, fmt):
    with open(path, "wb") as f:
        f.write(struct.pack("<%d%s" % (len(ids), fmt), *ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.path.join(HERE, "../../../../shared/data/tinyshakespeare.txt"))
    args = ap.parse_args()
    corpus_path = os.path.abspath(args.corpus)
    corpus = open(corpus_path, "rb").read().decode("utf-8")

    with open(os.path.join(HERE, "stress.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(STRESS_TEXT)
    with open(os.path.join(HERE, "stress_invalid.bin"), "wb") as f:
        f.write(STRESS_INVALID)
    inputs = {"stress": STRESS_TEXT, "stress_invalid": STRESS_INVALID.decode("utf-8", errors="replace"),
              "corpus": corpus}

    specs = {
        "gpt2_style": (pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), GPT2_PATTERN,
                       ["<|endoftext|>"]),
        "llama3_style": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
            LLAMA3_PATTERN, LLAMA3_SPECIALS),
    }
    manifest = {"tokenizers_version": tokenizers.__version__, "tiktoken_version": tiktoken.__version__,
                "corpus_sha256": hashlib.sha256(open(corpus_path, "rb").read()).hexdigest(),
                "corpus_bytes": os.path.getsize(corpus_path), "tokenizers": {}}
    for name, (pre, pattern, specials) in specs.items():
        tok = train(pre, corpus_path)
        ranks = ranks_of(tok)
        n = len(ranks)
        tok.add_special_tokens(specials)
        j = json.loads(tok.to_str())
        if name == "llama3_style":  # the list form of merges, as in Meta's Llama 3 tokenizer.json
            j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
        else:
            j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        with open(os.path.join(HERE, name + ".tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
        hf = Tokenizer.from_file(os.path.join(HERE, name + ".tokenizer.json"))
        with open(os.path.join(HERE, name + ".tiktoken"), "w") as f:
            for b, r in sorted(ranks.items(), key=lambda kv: kv[1]):
                f.write(base64.b64encode(b).decode() + " " + str(r) + "\n")
        special_ids = {s: n + i for i, s in enumerate(specials)}
        for s, i in special_ids.items():
            assert hf.token_to_id(s) == i, (s, i, hf.token_to_id(s))
        tk = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special_ids)
        info = {"merges": len(j["model"]["merges"]), "vocab_size": hf.get_vocab_size(), "ids": {}}
        for inp, text in inputs.items():
            a = hf.encode(text, add_special_tokens=False).ids
            b = tk.encode(text, allowed_special="all")
            if a != b:
                k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                sys.exit(f"{name} {inp}: tokenizers and tiktoken differ at id {k}: "
                         f"{a[max(0, k - 3):k + 5]} vs {b[max(0, k - 3):k + 5]}")
            fmt = "H" if inp == "corpus" else "I"
            write_ids(os.path.join(HERE, f"{name}.{inp}.ids"), a, fmt)
            info["ids"][inp] = {"count": len(a), "dtype": "uint16" if fmt == "H" else "uint32"}
            print(f"{name:13s} {inp:15s} {len(a):8d} ids, tokenizers == tiktoken")
        manifest["tokenizers"][name] = info
    # Variants: a base tokenizer.json with some keys changed (JSON pointer -> value), ids from
    # tokenizers alone (tiktoken has no such options) on the stress text.
    variants = {
        "gpt2_prefix_space": ("gpt2_style", [["/pre_tokenizer/add_prefix_space", True]]),
        "llama3_ignore_merges": ("llama3_style", [["/model/ignore_merges", True]]),
        "llama3_prefix_space": ("llama3_style",
                                [["/pre_tokenizer/pretokenizers/1/add_prefix_space", True]]),
    }
    for behavior in ("Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        variants["llama3_" + behavior] = ("llama3_style",
                                          [["/pre_tokenizer/pretokenizers/0/behavior", behavior]])
    variants["gpt2_split_string"] = ("gpt2_style", [["/pre_tokenizer", {
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "e"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}]])
    manifest["variants"] = {}
    for vname, (base, patch) in variants.items():
        j = json.load(open(os.path.join(HERE, base + ".tokenizer.json"), encoding="utf-8"))
        for pointer, value in patch:
            *parents, last = pointer.strip("/").split("/")
            node = j
            for k in parents:
                node = node[int(k)] if isinstance(node, list) else node[k]
            node[int(last) if isinstance(node, list) else last] = value
        ids = Tokenizer.from_str(json.dumps(j)).encode(STRESS_TEXT, add_special_tokens=False).ids
        write_ids(os.path.join(HERE, f"variant.{vname}.stress.ids"), ids, "I")
        manifest["variants"][vname] = {"base": base, "patch": patch, "count": len(ids)}
        print(f"{vname:25s} stress {len(ids):8d} ids (tokenizers)")
    with open(os.path.join(HERE, "golden.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
