"""safetensors written and read by hand (struct + json), for the golden fixture scripts
(make_gpt_fixture.py, make_llama_fixture.py, make_moe_fixture.py, make_bert_fixture.py):
little-endian, tensors back to back in the order given, the header padded with spaces to a multiple
of 8, metadata under "__metadata__"; F32 and I32 only. Reading checks that the data ends where the
last tensor does."""
import json
import struct
import sys

import torch

DTYPES = {torch.float32: "F32", torch.int32: "I32"}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, tensor) in data order."""
    assert sys.byteorder == "little"
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        data = bytes(t.contiguous().cpu().view(torch.uint8).reshape(-1).tolist())
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = metadata
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for data in blobs:
            f.write(data)


def read_safetensors(path):
    """(tensors by name, metadata)."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__")
    base, out, end_max = 8 + n, {}, 0
    for name, e in header.items():
        b, e_ = e["data_offsets"]
        fmt = {"F32": "f", "I32": "i"}[e["dtype"]]
        vals = struct.unpack("<%d%s" % ((e_ - b) // 4, fmt), buf[base + b:base + e_])
        dtype = torch.float32 if fmt == "f" else torch.int32
        out[name] = torch.tensor(vals, dtype=dtype).reshape(e["shape"])
        end_max = max(end_max, e_)
    assert base + end_max == len(buf), "trailing bytes in file"
    return out, meta
