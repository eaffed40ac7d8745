#!/usr/bin/env python3
"""The multiple-choice reference for `strata eval --task` (tests/mpi_test_eval.cc … test_eval.cc).

Writes mc_ids.jsonl: 16 examples in HellaSwag's shape with token ids ({"ctx_ids", "endings_ids",
"label"}: contexts of 2–12 ids, 4 endings of 1–6 ids, below vocabulary 97), and mc_reference.json:
for each tiny model of tests/golden/generate/ (transformers' GPT2LMHeadModel and
LlamaForCausalLM, float32 weights computed in float64), the log-likelihood of every ending after
its context — Σ log softmax(logits)[next token] over the ending's tokens, as
lm-evaluation-harness's loglikelihood requests compute it — and acc (argmax log-likelihood ==
label) and acc_norm (argmax of the log-likelihood per token of the ending; lm-eval divides by the
ending's characters, which ids do not have).

  /work/venv-hf/bin/python tests/golden/eval/make_eval_fixture.py
"""
import json
import os
import random

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "generate")


def main():
    rng = random.Random(2024)
    examples = []
    for _ in range(16):
        ctx = [rng.randrange(97) for _ in range(rng.randint(2, 12))]
        endings = [[rng.randrange(97) for _ in range(rng.randint(1, 6))] for _ in range(4)]
        examples.append({"ctx_ids": ctx, "endings_ids": endings, "label": rng.randrange(4)})
    with open(os.path.join(HERE, "mc_ids.jsonl"), "w") as f:
        for e in examples:
            f.write(json.dumps(e) + "\n")
    ref = {}
    for name, cls in (("hf_gpt2_tiny", transformers.GPT2LMHeadModel),
                      ("hf_llama_tiny", transformers.LlamaForCausalLM)):
        model = cls.from_pretrained(os.path.join(GEN, name), torch_dtype=torch.float64,
                                    attn_implementation="eager").eval()
        lls, acc, acc_norm = [], 0, 0
        for e in examples:
            row = []
            for end in e["endings_ids"]:
                ids = torch.tensor([e["ctx_ids"] + end])
                with torch.no_grad():
                    logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
                n = len(e["ctx_ids"])
                row.append(float(sum(logp[n - 1 + i, t] for i, t in enumerate(end))))
            lls.append(row)
            best = max(range(4), key=lambda i: (row[i], -i))
            best_norm = max(range(4), key=lambda i: (row[i] / len(e["endings_ids"][i]), -i))
            acc += best == e["label"]
            acc_norm += best_norm == e["label"]
        ref[name] = {"acc": acc / len(examples), "acc_norm": acc_norm / len(examples),
                     "loglikelihoods": lls}
        print(name, "acc", ref[name]["acc"], "acc_norm", ref[name]["acc_norm"])
    with open(os.path.join(HERE, "mc_reference.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "models": ref}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
