#!/usr/bin/env python3
"""Writes the training-trajectory fixtures (`data/fixtures/trajectory-{gpt2,bert}/`): a tiny
frozen pretrained transformer trained for 20 steps in PyTorch exactly as fpt trains it, so
that a test can replay the same steps in fpt and compare every loss and the trained
tensors. It catches wrong gradients and optimizer bugs that forward goldens cannot.

Run by hand, never by tests or CI:
    python3 -m venv /tmp/fx && /tmp/fx/bin/pip install torch transformers safetensors
    /tmp/fx/bin/python tools/make_trajectory.py
    /tmp/fx/bin/python tools/make_trajectory.py --autocast-bf16   # the same steps under torch.autocast(bfloat16)

The recipe (paper section 2.2 / appendix C, the reference code's fpt.py and trainer.py, as
fpt implements it):
- input layer `Linear(d_in, hidden)` (dropout off here), the backbone from
  `inputs_embeds` (its own dropouts off: eval mode), output layer `Linear(hidden, classes)`
  on the last position; mean cross-entropy over the batch;
- trained: input, output, every LayerNorm and the position table (fpt's default groups);
  attention and feed-forward weights frozen;
- Adam (PyTorch's, betas 0.9/0.999, eps 1e-8, no weight decay), lr 1e-3, constant;
  gradients averaged over the micro-batches of a step (BERT: 2 micro-batches of 2), then
  clipped to global norm 1.0 (`clip_grad_norm_`);
- every initial value is written (backbone as `save_pretrained` writes it, input and output
  layers in `trajectory.safetensors`), as are the 20 batches, the loss and pre-clip gradient
  norm of every step, and every trained tensor after step 20 (`final.<name>`, fpt's names).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "fixtures")
STEPS, BATCH, SEQ, D_IN, CLASSES = 20, 4, 6, 3, 3


def trained(name):
    n = name.lower()
    return any(k in n for k in ["ln", "layernorm", "wpe", "position_embeddings"])


def make(kind, model, micro, hidden):
    out = os.path.join(ROOT, f"trajectory-{kind}")
    os.makedirs(out, exist_ok=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    for extra in ["generation_config.json"]:
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    model.eval()  # the backbone's own dropouts off
    g = torch.Generator().manual_seed(11)
    inp = torch.nn.Linear(D_IN, hidden)
    outp = torch.nn.Linear(hidden, CLASSES)
    with torch.no_grad():
        for p in list(inp.parameters()) + list(outp.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    tensors = {
        "init.input.weight": inp.weight.detach().clone(),
        "init.input.bias": inp.bias.detach().clone(),
        "init.output.weight": outp.weight.detach().clone(),
        "init.output.bias": outp.bias.detach().clone(),
    }
    backbone = [(n, p) for n, p in model.named_parameters()]
    for n, p in backbone:
        p.requires_grad_(trained(n))
    params = [("input.weight", inp.weight), ("input.bias", inp.bias)]
    params += [(n, p) for n, p in backbone if p.requires_grad]
    params += [("output.weight", outp.weight), ("output.bias", outp.bias)]
    opt = torch.optim.Adam([p for _, p in params], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    xs = torch.randn(STEPS, BATCH, SEQ, D_IN, generator=g)
    ys = torch.randint(0, CLASSES, (STEPS, BATCH), generator=g)
    losses, norms = [], []
    for s in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for m in range(BATCH // micro):
            x = xs[s, m * micro:(m + 1) * micro]
            y = ys[s, m * micro:(m + 1) * micro]
            h = model(inputs_embeds=inp(x), return_dict=True).last_hidden_state
            loss = torch.nn.functional.cross_entropy(outp(h[:, -1, :]), y) / (BATCH // micro)
            loss.backward()
            total += loss.item()
        norms.append(torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0).item())
        opt.step()
        losses.append(total)
    tensors["batch.inputs"] = xs
    tensors["batch.labels"] = ys.to(torch.int64)
    tensors["losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    for n, p in params:
        # fpt's names: GPT-2 without the `transformer.` prefix (none here), BERT as saved.
        tensors[f"final.{n}"] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "trajectory.safetensors"))
    meta = {"script": "tools/make_trajectory.py", "torch": torch.__version__,
            "transformers": transformers.__version__, "python": sys.version.split()[0],
            "steps": STEPS, "batch_size": BATCH, "micro_batch_size": micro, "lr": 1e-3, "clip_norm": 1.0,
            "classes": CLASSES, "trained": [n for n, _ in params]}
    with open(os.path.join(out, "MADE_BY.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote", out, "losses", [round(v, 4) for v in losses], "grad norms", [round(v, 3) for v in norms])


def autocast_bf16(kind, cls):
    """The same 20 steps from the committed `trajectory-{kind}` fixture (its backbone, initial
    layers and batches, read back, so the f32 fixture stays byte-identical), with the forward
    and loss under `torch.autocast("cpu", dtype=torch.bfloat16)`: PyTorch's mixed precision,
    whose linear layers and matmuls (the backbone's frozen ones, the trained input and output
    layers, attention's products) take bf16 operands. Writes
    `trajectory-autocast-bf16.safetensors` beside `trajectory.safetensors` (same keys)."""
    from safetensors.torch import load_file
    out = os.path.join(ROOT, f"trajectory-{kind}")
    meta = json.load(open(os.path.join(out, "MADE_BY.json")))
    ref = load_file(os.path.join(out, "trajectory.safetensors"))
    model = cls.from_pretrained(out, **({"add_pooling_layer": False} if kind == "bert" else {}))
    model.eval()
    hidden = ref["init.input.weight"].shape[0]
    inp = torch.nn.Linear(D_IN, hidden)
    outp = torch.nn.Linear(hidden, CLASSES)
    with torch.no_grad():
        inp.weight.copy_(ref["init.input.weight"]); inp.bias.copy_(ref["init.input.bias"])
        outp.weight.copy_(ref["init.output.weight"]); outp.bias.copy_(ref["init.output.bias"])
    backbone = [(n, p) for n, p in model.named_parameters()]
    for n, p in backbone:
        p.requires_grad_(trained(n))
    params = [("input.weight", inp.weight), ("input.bias", inp.bias)]
    params += [(n, p) for n, p in backbone if p.requires_grad]
    params += [("output.weight", outp.weight), ("output.bias", outp.bias)]
    assert [n for n, _ in params] == meta["trained"], (kind, [n for n, _ in params])
    opt = torch.optim.Adam([p for _, p in params], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    xs, ys = ref["batch.inputs"], ref["batch.labels"]
    micro = meta["micro_batch_size"]
    losses, norms = [], []
    for s in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for m in range(BATCH // micro):
            x = xs[s, m * micro:(m + 1) * micro]
            y = ys[s, m * micro:(m + 1) * micro]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = model(inputs_embeds=inp(x), return_dict=True).last_hidden_state
                loss = torch.nn.functional.cross_entropy(outp(h[:, -1, :]), y) / (BATCH // micro)
            loss.backward()
            total += loss.item()
        norms.append(torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0).item())
        opt.step()
        losses.append(total)
    tensors = {k: v for k, v in ref.items() if k.startswith("init.") or k.startswith("batch.")}
    tensors["losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    for n, p in params:
        tensors[f"final.{n}"] = p.detach().clone().float()
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(out, "trajectory-autocast-bf16.safetensors"),
              metadata={"made_by": "tools/make_trajectory.py --autocast-bf16", "torch": torch.__version__,
                        "transformers": transformers.__version__, "autocast": "cpu, bfloat16"})
    ref_losses = ref["losses"].tolist()
    print("wrote", out, "autocast-bf16 losses", [round(v, 4) for v in losses],
          "max relative loss difference from f32", max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)))


def main():
    if "--autocast-bf16" in sys.argv[1:]:
        autocast_bf16("gpt2", transformers.GPT2Model)
        autocast_bf16("bert", transformers.BertModel)
        return
    torch.manual_seed(21)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=20, n_positions=8, n_embd=16, n_layer=2, n_head=2, layer_norm_epsilon=1e-5,
        bos_token_id=0, eos_token_id=0))
    make("gpt2", gpt2, micro=BATCH, hidden=16)
    torch.manual_seed(22)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=8, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu"),
        add_pooling_layer=False)
    make("bert", bert, micro=2, hidden=16)


if __name__ == "__main__":
    main()
