"""What the PyTorch references (torch_gpt.py, torch_llama.py, torch_bert.py) share: the device
set-up, its synchronisation, vocabulary padding, and running each --compile mode in turn with one
JSON line per mode (a failed mode prints an "error" line and does not hide the other's)."""
import json
import sys

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
