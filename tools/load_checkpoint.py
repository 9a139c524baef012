#!/usr/bin/env python3
"""Loads an fpt run's trainable tensors over its Hugging Face GPT-2 backbone in PyTorch and
evaluates it on fresh random Bit XOR / Bit Memory examples: the checkpoint is plain
safetensors that any framework reads.

    pip install torch transformers safetensors numpy
    python3 tools/load_checkpoint.py RUN_DIR [N_EXAMPLES]

RUN_DIR must come from a run with `--init pretrained` on a backbone `transformers` can load
(a local HF directory or a Hub id); randomly initialised frozen weights are drawn from fpt's
own generator and exist only inside fpt.

Tensor names in `trainable.safetensors`: `input.weight`/`input.bias` and
`output.weight`/`output.bias` (PyTorch `nn.Linear` layout, [out, in]), and backbone tensors
under their checkpoint names (`wpe.weight`, `h.0.ln_1.weight`, ...). GPT-2's Conv1D weights
(`c_attn`, `c_proj`, `c_fc`; present only when attention/MLP were trained) are stored as
[out, in] and are transposed back here.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file


def main(run, n_examples=2000):
    spec = json.load(open(os.path.join(run, "spec.json")))
    if spec["backbone"]["init"] != "pretrained":
        sys.exit("this run used a random backbone: its frozen weights exist only inside fpt")
    latest = open(os.path.join(run, "checkpoints", "LATEST")).read().strip()
    t = load_file(os.path.join(run, "checkpoints", latest, "trainable.safetensors"))

    model = transformers.GPT2Model.from_pretrained(spec["backbone"]["source"]).eval()
    sd = model.state_dict()
    loaded = 0
    for k, v in t.items():
        if k in sd:
            if any(s in k for s in (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
                v = v.t()
            sd[k].copy_(v)
            loaded += 1
    inp = torch.nn.Linear(t["input.weight"].shape[1], t["input.weight"].shape[0])
    out = torch.nn.Linear(t["output.weight"].shape[1], t["output.weight"].shape[0])
    with torch.no_grad():
        inp.weight.copy_(t["input.weight"]); inp.bias.copy_(t["input.bias"])
        out.weight.copy_(t["output.weight"]); out.bias.copy_(t["output.bias"])

    task = spec["task"]
    rng = np.random.default_rng(12345)
    if task["name"] == "bit-xor":
        n, patch = task.get("n_bits") or 5, task.get("patch") or 1
        bits = rng.integers(0, 2, size=(n_examples, 2, n))
        x = bits.reshape(n_examples, 2 * n // patch, patch).astype(np.float32)
        y = bits[:, 0] ^ bits[:, 1]
    elif task["name"] == "bit-memory":
        n, patch = task.get("n_bits") or 1000, task.get("patch") or 50
        pats = rng.integers(0, 2, size=(n_examples, 5, n)) * 2 - 1
        q = pats[np.arange(n_examples), rng.integers(0, 5, size=n_examples)]
        masked = q * rng.integers(0, 2, size=q.shape)
        x = np.concatenate([pats, masked[:, None]], axis=1).reshape(n_examples, 6 * n // patch, patch).astype(np.float32)
        y = (q > 0).astype(np.int64)
    else:
        sys.exit(f"task {task['name']} is not handled by this example")
    with torch.no_grad():
        h = model(inputs_embeds=inp(torch.from_numpy(x))).last_hidden_state
        logits = out(h[:, -(n // patch):]).reshape(n_examples, n, 2)
    acc = (logits.argmax(-1).numpy() == y).mean()
    print(f"loaded {loaded} backbone tensors and the input/output layers from {latest}; "
          f"{task['name']} bit accuracy on {n_examples} fresh examples: {acc:.4f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
