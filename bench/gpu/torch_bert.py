#!/usr/bin/env python3
"""PyTorch reference for Strata's GPU throughput on BERT: the same model, optimizer and precision.

Architecture (as models/bert/ builds model.arch "bert", Hugging Face's BertForPreTraining):
word + position + token-type embeddings and their LayerNorm; post-LayerNorm encoder blocks
(fused [q; k; v] projection -> bidirectional attention over the real keys of each sequence ->
output dense -> residual -> LayerNorm; dense -> exact GELU -> dense -> residual -> LayerNorm),
biases everywhere, LayerNorm eps 1e-12; the masked-LM head (dense -> GELU -> LayerNorm -> the word
embeddings, tied, plus its own bias) on every position with the loss over the masked ones, and
the next-sentence head (pooler dense -> tanh on [CLS] -> 2-way classifier). The vocabulary is
padded to a multiple of --pad-vocab (128, as Strata does for t=1) and the padding is left out of
the loss. Initialisation as Strata's (Hugging Face's): weights N(0, 0.02), biases 0, LayerNorm
weights 1. Weight decay on matrices and embeddings.

Batches as Strata's masked-LM samples of the benchmark config (configs/bench/bert-large-gpu.json:
synthetic documents, short_seq_prob 0): each sequence has a random real length in
[--min-length, S] (a key padding mask; the rest is padding), 15% of its positions predicted, a
random sentence label. Attention through torch.nn.functional.scaled_dot_product_attention with the
key padding mask as a boolean attn_mask (what transformers' sdpa BERT does). The loss is
masked_lm_loss (mean over the predicted positions of the micro-batch) + next_sentence_loss.

Training step: bf16 autocast with fp32 master weights, gradient clipping at 1.0, fused AdamW
(lr 1e-4, betas (0.9, 0.999), weight decay 0.01). Timed end to end with a device synchronisation
after each step (Strata reports the loss every step, so it syncs too).

FLOPs: Strata's model FLOPs (models/transformer/description.cc flops_per_iteration): per token and
layer 2·(4·C² + 2·C·F) + 4·S·C (the whole S×S scores, no causal half), plus 2·C² + 2·C·V for the
masked-LM head on every position, plus per sequence 2·C² + 4·C (pooler, classifier); times 3.
MFU = achieved model FLOP/s ÷ --peak-tflops (989: H100/H200 SXM dense bf16).

Prints one JSON line per run (--compile 0, 1, or both), in torch_gpt.py's format
(bench/gpu/summarize.py reads it). CPU smoke test:
  python3 bench/gpu/torch_bert.py --layers 2 --hidden 64 --heads 4 --ffn 256 --seq 32 \\
      --vocab 260 --micro-batch 2 --iters 3 --compile 0 --device cpu
Equivalence with Hugging Face's BertForPreTraining (tiny shapes, fp32, CPU; needs transformers):
  python3 bench/gpu/torch_bert.py --check-hf
"""
import argparse
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_common import add_run_args, device_of, padded, run_modes, time_training


class Block(nn.Module):
    def __init__(self, C, NH, FF, eps):
        super().__init__()
        self.NH = NH
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln1 = nn.LayerNorm(C, eps=eps)
        self.fc = nn.Linear(C, FF)
        self.out = nn.Linear(FF, C)
        self.ln2 = nn.LayerNorm(C, eps=eps)

    def forward(self, x, keep):
        B, S, C = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.NH, C // self.NH).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        a = self.ln1(x + self.proj(y.transpose(1, 2).reshape(B, S, C)))
        return self.ln2(a + self.out(F.gelu(self.fc(a))))


class Bert(nn.Module):
    def __init__(self, L, C, NH, FF, S, V, Vp, T=2, eps=1e-12):
        super().__init__()
        self.V = V
        self.word = nn.Embedding(Vp, C)
        self.pos = nn.Embedding(S, C)
        self.types = nn.Embedding(T, C)
        self.ln = nn.LayerNorm(C, eps=eps)
        self.blocks = nn.ModuleList(Block(C, NH, FF, eps) for _ in range(L))
        self.transform = nn.Linear(C, C)
        self.transform_ln = nn.LayerNorm(C, eps=eps)
        self.decoder_bias = nn.Parameter(torch.zeros(Vp))
        self.pooler = nn.Linear(C, C)
        self.classifier = nn.Linear(C, 2)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)
        with torch.no_grad():
            self.word.weight[V:].zero_()

    def logits(self, ids, types, lengths):
        B, S = ids.shape
        x = self.ln(self.word(ids) + self.pos.weight[:S] + self.types(types))
        keep = (torch.arange(S, device=ids.device)[None, :] < lengths[:, None])[:, None, None, :]
        for blk in self.blocks:
            x = blk(x, keep)
        t = self.transform_ln(F.gelu(self.transform(x)))
        mlm = t @ self.word.weight.t() + self.decoder_bias
        nsp = self.classifier(torch.tanh(self.pooler(x[:, 0])))
        return mlm, nsp

    def forward(self, ids, types, lengths, targets, predict, labels):
        mlm, nsp = self.logits(ids, types, lengths)
        mlm = mlm[..., :self.V].float()
        mlm_loss = F.cross_entropy(mlm[predict], targets[predict])
        return mlm_loss + F.cross_entropy(nsp.float(), labels)


def model_flops_per_iter(batch, S, L, C, FF, V):
    per_token = L * (2 * (4 * C * C + 2 * C * FF) + 4 * S * C) + 2 * C * C + 2 * C * V
    per_sequence = 2 * C * C + 4 * C
    return 3 * batch * (S * per_token + per_sequence)


def make_batch(args, device, gen):
    B, S = args.micro_batch, args.seq
    lengths = torch.randint(args.min_length, S + 1, (B,), generator=gen)
    ids = torch.randint(0, args.vocab, (B, S), generator=gen)
    types = torch.zeros(B, S, dtype=torch.long)
    predict = torch.zeros(B, S, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        cut = int(torch.randint(2, n - 1, (1,), generator=gen))
        types[b, cut:n] = 1
        k = max(1, round(0.15 * n))
        predict[b, 1 + torch.randperm(n - 2, generator=gen)[:k]] = True
    labels = torch.randint(0, 2, (B,), generator=gen)
    return [t.to(device) for t in (ids, types, lengths, ids.clone(), predict, labels)]


def run(args, compiled, device):
    torch.manual_seed(args.seed)
    vp = padded(args.vocab, args.pad_vocab)
    model = Bert(args.layers, args.hidden, args.heads, args.ffn, args.seq, args.vocab, vp).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(args.seed)
    # BERT's optimizer (weight decay 0.01, betas (0.9, 0.999)) and its masked-LM micro-batches.
    t = time_training(args, model, device, compiled, make_batch=lambda: make_batch(args, device, gen),
                      weight_decay=0.01, betas=(0.9, 0.999))
    losses, first_s = t["losses"], t["first_s"]
    step_s = t["step_s"]
    tokens = args.global_batch * args.seq
    tflops = model_flops_per_iter(args.global_batch, args.seq, args.layers, args.hidden, args.ffn,
                                  args.vocab) / step_s / 1e12
    out = {
        "impl": "torch.compile" if compiled else "torch-eager",
        "label": args.label or f"bert-l{args.layers}-h{args.hidden}-s{args.seq}",
        "compile": int(compiled), "arch": "bert",
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "ffn": args.ffn,
        "seq": args.seq, "vocab": args.vocab, "vocab_padded": vp, "min_length": args.min_length,
        "micro_batch": args.micro_batch, "global_batch": args.global_batch,
        "precision": args.precision, "params": n_params, "warmup": args.warmup,
        "iters": args.iters, "step_ms": step_s * 1e3, "step_ms_min": t["step_s_min"] * 1e3,
        "tokens_per_s": tokens / step_s, "tflops_per_gpu": tflops,
        "mfu": tflops / args.peak_tflops, "peak_tflops": args.peak_tflops, "first_step_s": first_s,
        "mem_peak_bytes": t["mem_peak_bytes"],
        "loss_first": losses[0], "loss_last": losses[-1],
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def check_hf():
    """This model against transformers' BertForPreTraining (eager attention) on the same weights:
    masked-LM and next-sentence logits on a padded batch, and the loss."""
    from transformers import BertConfig, BertForPreTraining
    torch.manual_seed(0)
    L, C, NH, FF, S, V = 2, 64, 4, 96, 16, 97
    ours = Bert(L, C, NH, FF, S, V, V).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(0.1 * torch.randn_like(p))
    cfg = BertConfig(num_hidden_layers=L, hidden_size=C, num_attention_heads=NH,
                     intermediate_size=FF, vocab_size=V, max_position_embeddings=S,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     attn_implementation="eager")
    hf = BertForPreTraining(cfg).eval()
    sd = {"bert.embeddings.word_embeddings.weight": ours.word.weight,
          "bert.embeddings.position_embeddings.weight": ours.pos.weight,
          "bert.embeddings.token_type_embeddings.weight": ours.types.weight,
          "bert.embeddings.LayerNorm.weight": ours.ln.weight,
          "bert.embeddings.LayerNorm.bias": ours.ln.bias,
          "bert.pooler.dense.weight": ours.pooler.weight, "bert.pooler.dense.bias": ours.pooler.bias,
          "cls.predictions.bias": ours.decoder_bias,
          "cls.predictions.transform.dense.weight": ours.transform.weight,
          "cls.predictions.transform.dense.bias": ours.transform.bias,
          "cls.predictions.transform.LayerNorm.weight": ours.transform_ln.weight,
          "cls.predictions.transform.LayerNorm.bias": ours.transform_ln.bias,
          "cls.seq_relationship.weight": ours.classifier.weight,
          "cls.seq_relationship.bias": ours.classifier.bias}
    for i, blk in enumerate(ours.blocks):
        h = f"bert.encoder.layer.{i}."
        for k, part in enumerate(("query", "key", "value")):
            sd[h + f"attention.self.{part}.weight"] = blk.qkv.weight[k * C:(k + 1) * C]
            sd[h + f"attention.self.{part}.bias"] = blk.qkv.bias[k * C:(k + 1) * C]
        for ours_name, theirs in (("proj", "attention.output.dense"),
                                  ("ln1", "attention.output.LayerNorm"),
                                  ("fc", "intermediate.dense"), ("out", "output.dense"),
                                  ("ln2", "output.LayerNorm")):
            mod = getattr(blk, ours_name)
            sd[h + theirs + ".weight"], sd[h + theirs + ".bias"] = mod.weight, mod.bias
    missing, unexpected = hf.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= {"cls.predictions.decoder.weight",
                                               "cls.predictions.decoder.bias"}, (missing, unexpected)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (3, S), generator=gen)
    types = (torch.arange(S)[None, :] >= torch.tensor([[5], [3], [8]])).long()
    lengths = torch.tensor([16, 9, 12])
    mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        mlm, nsp = ours.logits(ids, types, lengths)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    diff = max(float((mlm - ref.prediction_logits).abs().max()),
               float((nsp - ref.seq_relationship_logits).abs().max()))
    ok = diff < 1e-4
    print(json.dumps({"check": "hf", "arch": "bert", "logits_max_abs_diff": diff, "ok": ok}))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--pad-vocab", type=int, default=128)
    ap.add_argument("--min-length", type=int, default=None,
                    help="shortest real length of a sequence (default seq/2)")
    add_run_args(ap, micro_batch=32, iters=10, warmup=3, lr=1e-4)
    ap.add_argument("--check-hf", action="store_true",
                    help="only compare this model with transformers.BertForPreTraining and exit")
    args = ap.parse_args()
    if args.check_hf:
        sys.exit(check_hf())
    if args.global_batch is None:
        args.global_batch = args.micro_batch
    if args.min_length is None:
        args.min_length = args.seq // 2
    run_modes(args, run, device_of(args))


if __name__ == "__main__":
    main()
