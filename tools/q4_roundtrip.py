#!/usr/bin/env python3
"""Write a copy of a safetensors checkpoint whose weight matrices went through GGUF's Q4_1
quantization and back, to measure what 4-bit weights alone do to FPT training on a model
whose unquantized weights we have (SmolLM2 here is only available as Q4_1).

Q4_1, as llama.cpp's ggml defines it: each row is cut into blocks of 32 values; a block
keeps its minimum m and step d = (max - m) / 15, both stored as f16, and each value as
q = round((x - m) / d) in 0..15; it reads back as q * d + m. The SmolLM2 GGUF quantizes
every 2-D matrix of its blocks this way (its norms stay F32, its token table is Q8_0), so
this script does the same to every 2-D tensor whose name matches --pattern (default: the
encoder's attention and feed-forward matrices) and copies the rest unchanged.

    python tools/q4_roundtrip.py <model dir> <out dir>
    fpt train --task mnist --backbone <out dir> ...

Prints, per tensor kind, the relative error the round trip left.
"""

import argparse
import re
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def q4_1(w: np.ndarray) -> np.ndarray:
    rows, cols = w.shape
    if cols % 32:
        raise SystemExit(f"rows of {cols} values do not split into blocks of 32")
    b = w.astype(np.float32).reshape(rows, cols // 32, 32)
    lo = b.min(axis=2, keepdims=True)
    hi = b.max(axis=2, keepdims=True)
    d = ((hi - lo) / 15.0).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    q = np.clip(np.floor((b - m) * inv + 0.5), 0, 15)
    return (q * d + m).reshape(rows, cols).astype(w.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a directory with config.json and model.safetensors")
    ap.add_argument("out", type=Path, help="where the copy goes (created; must not exist)")
    ap.add_argument(
        "--pattern",
        default=r"encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)\.weight$",
        help="regex of the tensor names to quantize",
    )
    a = ap.parse_args()
    if a.out.exists():
        raise SystemExit(f"{a.out} exists: choose a new directory")
    tensors = load_file(str(a.src / "model.safetensors"))
    pat = re.compile(a.pattern)
    out, errs = {}, {}
    for name, w in tensors.items():
        if w.ndim == 2 and pat.search(name):
            r = q4_1(w)
            kind = re.sub(r"\.\d+\.", ".N.", name)
            errs.setdefault(kind, []).append(float(np.linalg.norm(r - w) / np.linalg.norm(w)))
            out[name] = r
        else:
            out[name] = w
    if not errs:
        raise SystemExit(f"no tensor matches {a.pattern!r}")
    tmp = a.out.with_name(a.out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in a.src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, tmp / f.name)
    save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tmp.rename(a.out)
    for kind, e in sorted(errs.items()):
        print(f"{kind}: {len(e)} tensors, relative error {np.mean(e):.4f} (max {max(e):.4f})")


if __name__ == "__main__":
    main()
