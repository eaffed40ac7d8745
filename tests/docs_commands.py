#!/usr/bin/env python3
"""docs_commands — every command line the docs show runs.

    tests/docs_commands.py --build BUILD_DIR [--list] [--only TEXT] [--keep]

Extracts the command lines of the fenced code blocks (not those marked ```text, which show
output) of README.md and docs/*.md (a line, with its
backslash continuations, whose first word is build/strata, strata, mpirun, launch/strata-run,
scripts/..., bench/..., build/bench/... or mkdir, after any VAR=value words) and runs each one,
in the order the docs give them, from a scratch copy of the repository root: a temporary folder
whose configs/, tests/, launch/, scripts/, bench/ link to this checkout, build/ to BUILD_DIR, and
../shared to the checkout's ../shared, so the outputs (plan.json, ckpt/, data/) land there.

What makes a line cheap, kept in the tables below:
  PLACEHOLDERS  words the docs use for "your file" (FILE, tok.json, ckpt/, hf-model/, ...), given a
                real one: a tiny config, files FIXTURES writes, a checkpoint SETUP trains;
  every `strata train` without --dry-run runs 2 iterations (TRAIN_SHORT), mpirun gets
  --oversubscribe and one thread a rank;
  OVERRIDES     the whole command to run instead of one line (a line that needs another input);
  NOT_RUN       lines not run, each with its reason (kept short: a GPU, another machine, a run of
                minutes). A table entry that no doc line matches is an error, so the tables
                follow the docs.

Exit status: 0 when every line ran with status 0, 1 when one failed (its output is printed), 77
when ../shared/data/tinyshakespeare.txt is missing (ctest counts it as skipped).
"""
import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The data the docs train on: ../shared/data beside the checkout (ctest passes CMake's choice).
SHARED = os.path.dirname(os.environ.get("STRATA_SHARED_DATA")
                         or os.path.join(os.path.dirname(ROOT), "shared", "data"))
CORPUS = os.path.join(SHARED, "data", "tinyshakespeare.txt")
SKIP = 77

COMMANDS = ("build/strata", "strata", "mpirun", "launch/strata-run", "mkdir")
PREFIXES = ("scripts/", "bench/", "build/bench/")
STRATA_COMMANDS = {"train", "plan", "schedule", "profile", "trace-svg", "export", "data",
                   "generate", "eval"}

TINY = "configs/train/shakespeare.json"
BPE = "configs/train/shakespeare-bpe.json"
TRAIN_SHORT = ["--set", "train.iterations=2", "--set", "train.eval_iters=1"]

PLACEHOLDERS = {
    "FILE": TINY,
    "tok.json": "tok.json",  # FIXTURES: the GPT-2-style tokenizer of the golden tests
    "docs.jsonl": "docs.jsonl",
    "choices.jsonl": "choices.jsonl",
    "hellaswag_like.jsonl": "choices.jsonl",
}

# Files the commands read, written into the scratch root first.
FIXTURES = {
    "docs.jsonl": "".join('{"text": "%s"}\n' % t for t in [
        "First Citizen: Before we proceed any further, hear me speak.",
        "All: Speak, speak.", "First Citizen: You are all resolved rather to die than to famish?"]),
    "choices.jsonl": "".join(
        '{"ctx": "%s", "endings": [" to be", " the king", " my lord"], "label": %d}\n' % (c, i % 3)
        for i, c in enumerate(["To be, or not", "Long live", "I thank you,", "Good morrow,"])),
}

# Inputs the commands need that a run makes: a checkpoint of the BPE model (ckpt/, its trace in
# log.trace) and its Hugging Face export (hf-model/), made before the doc lines run.
SETUP = [
    ["cp", "tests/golden/tokenizer/gpt2_style.tokenizer.json", "tok.json"],
    ["build/strata", "train", "--config", BPE, "--set", "checkpoint.dir=ckpt", "--set", "checkpoint.interval=2", "--set", "log.trace=log.trace"]
    + TRAIN_SHORT,
    ["build/strata", "export", "--checkpoint", "ckpt/", "--out", "hf-model/"],
    ["build/strata", "plan", "--model", TINY, "--cluster", "cpu-local", "--json",
     "tiny-plan.json"],
]

# Doc line (as extracted: words joined by single spaces, comments dropped) -> what runs instead.
OVERRIDES = {
    # plan.json is the doc's plan of gpt3-175b; a plan must be for the config's model.
    "build/strata train --config FILE --plan plan.json":
        "build/strata train --config FILE --plan tiny-plan.json",
    # The BPE checkpoint decodes with tok.json; the doc's FILE is the model it was trained as.
    "build/strata eval --checkpoint ckpt/ --config FILE --data val --batches 16 --batch-size 8":
        "build/strata eval --checkpoint ckpt/ --config " + BPE
        + " --data val --batches 2 --batch-size 8",
}

# Doc line -> why it is not run.
NOT_RUN = {
    "scripts/quickstart": "installs packages and builds (scripts/deps, scripts/build) before "
                          "its training run of minutes",
    "scripts/test": "the whole CI, this test among it",
    "scripts/sanitize address -R '^Checkpoint\\.'": "a sanitizer build of the project (CI's "
                                                     "scripts/test runs it)",
    "scripts/sanitize thread": "a sanitizer build of the project (CI's scripts/test runs it)",
    "scripts/sanitize": "sanitizer builds of the project (CI's scripts/test runs them)",
    "scripts/layout_fingerprints --strata parent/strata --out /tmp/fp-old --planner":
        "dozens of training runs (minutes), and parent/strata is another commit's build",
    "scripts/layout_fingerprints --strata build/strata --out /tmp/fp-new --planner":
        "dozens of training runs (minutes)",
    "scripts/layout_fingerprints --compare /tmp/fp-old/fingerprints.json "
    "/tmp/fp-new/fingerprints.json": "compares the two runs above",
    "PYTHON=/path/to/python-with-torch bench/cpu_vs_torch.sh build 5": "needs PyTorch",
    "build/bench/bench_tokenizer tests/golden/tokenizer/llama3_style.tiktoken --pattern llama3 "
    "--unique-mb 8 --python \"$(command -v python3)\"": "needs a python3 that imports tiktoken",
}


def extract(path):
    """(line number, text) of every command line of the fenced blocks of `path`."""
    out = []
    lines = open(path, encoding="utf-8").read().split("\n")
    fenced = output = False
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("```"):
            fenced = not fenced
            # A block marked ```text shows what a command printed, not commands.
            output = fenced and line[3:].strip() == "text"
            continue
        if not fenced or output:
            continue
        start = i
        while line.endswith("\\") and i < len(lines):
            line = line[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        k = 0
        while k < len(words) and re.match(r"^[A-Z_][A-Z0-9_]*=", words[k]):
            k += 1
        if k == len(words):
            continue
        first = words[k]
        if first not in COMMANDS and not first.startswith(PREFIXES):
            continue
        if first in ("strata", "build/strata") and len(words) > k + 1 and not (
                words[k + 1] in STRATA_COMMANDS or words[k + 1].startswith("--")):
            continue  # output that names the command ("strata train: ...")
        # The text as written, less its comment: the tables' key.
        text = line.split(" #")[0].strip() if "#" in line else line
        text = " ".join(text.split())
        out.append((start, text))
    return out


def command_for(text):
    """The argv that runs the doc line `text`."""
    text = OVERRIDES.get(text, text)
    words = [PLACEHOLDERS.get(w, w) for w in shlex.split(text, comments=True)]
    if words[0] == "strata":
        words[0] = "build/strata"
    if words[0] == "mpirun":
        extra = ["--oversubscribe", "-x", "OMP_NUM_THREADS=1"]
        if os.getuid() == 0:
            extra.append("--allow-run-as-root")
        words[1:1] = extra
    runs_training = "train" in words or words[0] == "launch/strata-run"
    if runs_training and "--dry-run" not in words and "strata" in " ".join(words):
        words += TRAIN_SHORT
    return words


def scratch_root(build):
    """A temporary repository root: links to this checkout's inputs, build/, ../shared."""
    top = tempfile.mkdtemp(prefix="strata-docs-")
    root = os.path.join(top, "repo")
    os.mkdir(root)
    for name in ("configs", "tests", "launch", "scripts", "bench", "docs"):
        os.symlink(os.path.join(ROOT, name), os.path.join(root, name))
    os.symlink(os.path.abspath(build), os.path.join(root, "build"))
    os.symlink(SHARED, os.path.join(top, "shared"))
    for name, text in FIXTURES.items():
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.write(text)
    return top, root


def run(argv, root, timeout):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["STRATA_BIN"] = os.path.join(root, "build", "strata")  # launch/strata-run's strata
    assigns = []
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        assigns.append(argv.pop(0))
    for a in assigns:
        k, v = a.split("=", 1)
        env[k] = v
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), time.monotonic() - t0
    except OSError as e:  # a program that is not there (a benchmark not built)
        return "not started", "%s (build every target: scripts/build)\n" % e, 0.0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        return "timeout", out, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--build", required=True, help="the CMake build folder holding strata")
    ap.add_argument("--list", action="store_true", help="print the lines and what runs, only")
    ap.add_argument("--only", help="run only the lines containing this text")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a line may take")
    args = ap.parse_args()

    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    lines = [(os.path.relpath(d, ROOT), n, t) for d in docs for n, t in extract(d)]
    texts = {t for _, _, t in lines}
    stale = [k for k in list(OVERRIDES) + list(NOT_RUN) if k not in texts]
    if stale:
        for k in stale:
            print("docs_commands: a table entry no doc line matches (update the table): " + k)
        return 1
    if args.list:
        for f, n, t in lines:
            what = ("not run: " + NOT_RUN[t]) if t in NOT_RUN else shlex.join(command_for(t))
            print("%s:%d: %s\n    %s" % (f, n, t, what))
        return 0
    if not os.path.isfile(CORPUS):
        print("docs_commands: skipped, %s is missing (the docs' commands train on it)" % CORPUS)
        return SKIP

    top, root = scratch_root(args.build)
    failed = []
    try:
        for argv in SETUP:
            status, out, secs = run(list(argv), root, args.timeout)
            if status != 0:
                print(out)
                print("docs_commands: setup failed (status %s): %s" % (status, shlex.join(argv)))
                return 1
        for f, n, t in lines:
            if args.only and args.only not in t:
                continue
            where = "%s:%d" % (f, n)
            if t in NOT_RUN:
                print("not run   %s: %s (%s)" % (where, t, NOT_RUN[t]))
                continue
            argv = command_for(t)
            status, out, secs = run(list(argv), root, args.timeout)
            if status == 0:
                print("ok %5.1fs %s: %s" % (secs, where, t))
            else:
                failed.append(where)
                print("FAILED    %s: %s\n  ran: %s\n  status %s after %.1fs, output:\n%s" %
                      (where, t, shlex.join(argv), status, secs, out[-4000:]))
    finally:
        if args.keep:
            print("docs_commands: kept " + top)
        else:
            shutil.rmtree(top, ignore_errors=True)
    if failed:
        print("docs_commands: %d doc command line(s) failed: %s" % (len(failed), ", ".join(failed)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
