#!/usr/bin/env python3
"""Writes the golden fixtures the Rust tests compare against (llm.c's test_gpt2 style).

Run by hand, never by tests or CI:
    python3 -m venv /tmp/fx && /tmp/fx/bin/pip install torch transformers safetensors
    /tmp/fx/bin/python tools/make_fixtures.py

For each architecture it writes a tiny random checkpoint in the model's exact Hugging Face
format (`config.json` + `model.safetensors`, via `save_pretrained`) and `golden.safetensors`
with a fixed input, the hidden states `transformers` computes (eval mode, no dropout), and
the gradients of a fixed scalar loss, so both forward and backward are checked.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "fixtures")


def gpt2_tiny():
    out = os.path.join(ROOT, "gpt2-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5,
    )
    model = transformers.GPT2Model(cfg)
    # Perturb every tensor (LayerNorm and biases included) so the test exercises all of them.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    model.eval()

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 7, 32, generator=g)
    res = model(inputs_embeds=x, output_hidden_states=True, return_dict=True)
    loss = (res.last_hidden_state * r).sum()
    loss.backward()
    named = dict(model.named_parameters())
    tensors = {
        "inputs_embeds": x.detach(),
        "loss_weights": r,
        "last_hidden_state": res.last_hidden_state.detach(),
        "grad.inputs_embeds": x.grad,
        "grad.wpe.weight": named["wpe.weight"].grad,
        "grad.h.0.ln_1.weight": named["h.0.ln_1.weight"].grad,
        "grad.h.1.ln_2.bias": named["h.1.ln_2.bias"].grad,
        "grad.ln_f.weight": named["ln_f.weight"].grad,
    }
    for i, h in enumerate(res.hidden_states):
        tensors[f"hidden_states.{i}"] = h.detach()
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, os.path.join(out, "golden.safetensors"))
    with open(os.path.join(out, "MADE_BY.json"), "w") as f:
        json.dump({"script": "tools/make_fixtures.py", "torch": torch.__version__,
                   "transformers": transformers.__version__, "python": sys.version.split()[0]}, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    gpt2_tiny()
