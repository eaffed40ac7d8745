"""What the PyTorch references (torch_gpt.py, torch_llama.py, torch_bert.py) share: the device
set-up, its synchronisation, vocabulary padding, and running each --compile mode in turn with one
JSON line per mode (a failed mode prints an "error" line and does not hide the other's)."""
import json
import statistics
import sys
import time

import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def padded(vocab, multiple):
    return (vocab + multiple - 1) // multiple * multiple


def device_of(args):
    """torch.device(--device), with TF32 matmuls on a GPU (exits when torch sees no GPU)."""
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torch sees no CUDA device (use --device cpu for a smoke test)")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


def run_modes(args, run, device):
    """run(args, compiled, device) for each mode of --compile ("0,1": eager, then compiled);
    exits 1 when a mode failed."""
    status = 0
    for c in [int(x) for x in args.compile.split(",")]:
        try:
            run(args, bool(c), device)
        except Exception as e:  # one failed mode (e.g. compile) must not hide the other's line
            print(json.dumps({"impl": "torch.compile" if c else "torch-eager",
                              "label": args.label, "compile": c, "error": repr(e)[:500]}),
                  flush=True)
            status = 1
    sys.exit(status)


def add_run_args(ap, micro_batch, iters, warmup, lr):
    """The options every reference shares (batch, timing, precision, compile, device, label,
    seed), with the model's defaults for the batch, timing and learning rate."""
    ap.add_argument("--micro-batch", type=int, default=micro_batch)
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per optimizer step (default: --micro-batch); the rest is "
                         "gradient accumulation, as Strata's global_batch_size")
    ap.add_argument("--iters", type=int, default=iters, help="timed iterations (median reported)")
    ap.add_argument("--warmup", type=int, default=warmup, help="untimed iterations first")
    ap.add_argument("--compile", default="0,1",
                    help="0 eager, 1 torch.compile, or a comma list run in turn (default 0,1)")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="peak dense TFLOP/s for MFU (989: H100/H200 SXM bf16)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--label", default=None, help="name to match Strata's run in summarize.py")
    ap.add_argument("--seed", type=int, default=1234)


def time_training(args, model, device, compiled, vocab=None, make_batch=None, weight_decay=0.1,
                  betas=(0.9, 0.95)):
    """Trains `model` as Strata's benchmarks do and times it: bf16 autocast with fp32 master
    weights (--precision), fused AdamW (--lr, betas, weight decay on matrices and embeddings, not on
    1-D weights), gradient clipping at 1.0, --global-batch sequences a step in micro-batches of
    --micro-batch. The micro-batches come from a pool made up front (no RNG or host->device copy
    is timed): make_batch() -> the arguments of model(...), or by default random tokens below
    `vocab`, model(inputs, targets). Each step ends with a device synchronisation (Strata reports
    the loss every step, so it syncs too). Returns the step's median seconds over --iters after
    --warmup, the fastest, the first step's (with torch.compile's compilation), the losses and
    the peak device memory (None on the CPU)."""
    if args.global_batch % args.micro_batch:
        sys.exit("--global-batch must be a multiple of --micro-batch")
    accum = args.global_batch // args.micro_batch
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=betas, eps=1e-8, fused=fused)
    fwd = torch.compile(model) if compiled else model
    use_bf16 = args.precision == "bf16"
    if make_batch is None:
        def make_batch():
            b = torch.randint(0, vocab, (args.micro_batch, args.seq + 1), device=device)
            return b[:, :-1], b[:, 1:]
    pool = [make_batch() for _ in range(min(8, max(2, accum * 2)))]

    def step(it):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(accum):
            batch = pool[(it * accum + m) % len(pool)]
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss = fwd(*batch) / accum
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=fused or None)
        opt.step()
        return total

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses, first_s = [], [], None
    for it in range(args.warmup + args.iters):
        sync(device)
        t0 = time.perf_counter()
        loss = step(it)
        losses.append(float(loss))
        sync(device)
        dt = time.perf_counter() - t0
        if it == 0:
            first_s = dt
        if it >= args.warmup:
            times.append(dt)
    mem = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    del fwd, opt, pool
    return {"step_s": statistics.median(times), "step_s_min": min(times), "first_s": first_s,
            "losses": losses, "mem_peak_bytes": mem}
