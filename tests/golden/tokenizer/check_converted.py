#!/usr/bin/env python3
"""Check `strata data convert` (a tiktoken ranks file -> tokenizer.json) on real vocabularies
against the references: the tokenizer.json it writes, read by Hugging Face `tokenizers` and by
transformers' PreTrainedTokenizerFast, must give the ids tiktoken gives for the same ranks.

  /work/venv/bin/python tests/golden/tokenizer/check_converted.py --strata build/strata \\
      --gpt2 PATH/gpt2.tiktoken --llama3 PATH/tokenizer.model [--corpus PATH]

gpt2.tiktoken ships in PyPI's openai-whisper (whisper/assets/), Llama 3's tokenizer.model in
llama-models (models/llama3/). Texts: the committed stress text, its invalid-UTF-8 bytes (as
Python's errors="replace" reads them), and the corpus (tinyshakespeare beside the checkout).
Needs tiktoken, tokenizers and transformers; CI does not run it (the committed fixtures carry the
same check at 4352 tokens: tests/test_tokenizer.cc, the "converted" cases).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import tiktoken
import tokenizers
import transformers
from tiktoken.load import load_tiktoken_bpe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_tokenizer_fixtures import GPT2_PATTERN, LLAMA3_PATTERN, LLAMA3_SPECIALS  # noqa: E402


def reference(path, pattern):
    ranks = load_tiktoken_bpe(path)
    n = len(ranks)
    if pattern == "gpt2":
        specials = {"<|endoftext|>": n}
        regex = GPT2_PATTERN
    else:
        specials = {t: n + i for i, t in enumerate(LLAMA3_SPECIALS)}
        regex = LLAMA3_PATTERN
    return tiktoken.Encoding(name=pattern, pat_str=regex, mergeable_ranks=ranks,
                             special_tokens=specials)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--gpt2", required=True)
    ap.add_argument("--llama3", required=True)
    ap.add_argument("--corpus", default=os.path.join(HERE, "../../../../shared/data/tinyshakespeare.txt"))
    a = ap.parse_args()
    texts = {
        "stress": open(os.path.join(HERE, "stress.txt"), encoding="utf-8").read(),
        "stress_invalid": open(os.path.join(HERE, "stress_invalid.bin"), "rb").read().decode(
            "utf-8", errors="replace"),
    }
    if os.path.exists(a.corpus):
        texts["corpus"] = open(a.corpus, encoding="utf-8").read()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for pattern, path in (("gpt2", a.gpt2), ("llama3", a.llama3)):
            out = os.path.join(tmp, pattern + ".tokenizer.json")
            subprocess.run([a.strata, "data", "convert", "--tokenizer", path, "--output", out],
                           check=True)
            enc = reference(path, pattern)
            hf = tokenizers.Tokenizer.from_file(out)
            fast = transformers.PreTrainedTokenizerFast(tokenizer_file=out)
            for name, text in texts.items():
                want = enc.encode(text, allowed_special="all")
                got = hf.encode(text, add_special_tokens=False).ids
                got_fast = fast(text, add_special_tokens=False)["input_ids"]
                same = got == want and got_fast == want
                failed += not same
                print(f"{pattern:7s} {name:15s} {len(want):8d} ids: tokenizers "
                      f"{'equal' if got == want else 'DIFFER'}, transformers "
                      f"{'equal' if got_fast == want else 'DIFFER'} to tiktoken; "
                      f"decode {'equal' if hf.decode(want, skip_special_tokens=False) == text else 'differs'}")
    print(f"tiktoken {tiktoken.__version__}, tokenizers {tokenizers.__version__}, "
          f"transformers {transformers.__version__}: {'all equal' if not failed else f'{failed} differ'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
