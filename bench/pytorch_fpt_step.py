#!/usr/bin/env python3
"""The PyTorch reference of `fpt bench`: the same FPT step (HF GPT2Model fed inputs_embeds,
random init at the shape, input Linear with orthogonal init or an Embedding, output Linear on
the last token, attention and MLP frozen, Adam lr 1e-3, clip 1.0, dropouts on) and the full
fine-tune step, timed the same way (median of --steps after --warmup), on synthetic data.

    pip install torch transformers
    python3 bench/pytorch_fpt_step.py --shape c10 [--steps 5] [--warmup 2] [--threads 2] [--device cuda]

Prints one JSON object: pytorch_ms, pytorch_full_ms, peak_rss_mb, torch and transformers
versions. `cargo xtask bench step` runs it when torch and transformers are importable.
"""
import argparse
import json
import resource
import statistics
import time

import torch
import transformers

SHAPES = {
    "tiny": dict(layers=2, hidden=64, heads=4, batch=4, tokens=16, width=8, vocab=None, classes=10),
    "c10": dict(layers=12, hidden=768, heads=12, batch=16, tokens=64, width=48, vocab=None, classes=10),
    "lra": dict(layers=12, hidden=768, heads=12, batch=2, tokens=1024, width=1, vocab=None, classes=10),
    "listops": dict(layers=12, hidden=768, heads=12, batch=4, tokens=512, width=None, vocab=15, classes=10),
}


class Fpt(torch.nn.Module):
    def __init__(self, s, full):
        super().__init__()
        cfg = transformers.GPT2Config(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"],
                                      n_positions=max(1024, s["tokens"]))
        self.transformer = transformers.GPT2Model(cfg)
        if s["vocab"]:
            self.inp = torch.nn.Embedding(s["vocab"], s["hidden"])
        else:
            self.inp = torch.nn.Sequential(torch.nn.Linear(s["width"], s["hidden"]), torch.nn.Dropout(0.1))
            torch.nn.init.orthogonal_(self.inp[0].weight, gain=1.41)
            self.inp[0].bias.data.zero_()
        self.out = torch.nn.Linear(s["hidden"], s["classes"])
        for name, p in self.transformer.named_parameters():
            n = name.lower()
            if full:
                p.requires_grad = "wte" not in n
            else:
                p.requires_grad = ("ln" in n) or ("wpe" in n)

    def forward(self, x):
        h = self.transformer(inputs_embeds=self.inp(x)).last_hidden_state
        return self.out(h[:, -1])


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(s, full, warmup, steps, device):
    torch.manual_seed(0)
    model = Fpt(s, full).train().to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3)
    if s["vocab"]:
        x = torch.randint(0, s["vocab"], (s["batch"], s["tokens"]))
    else:
        x = torch.randn(s["batch"], s["tokens"], s["width"])
    y = torch.randint(0, s["classes"], (s["batch"],))
    x, y = x.to(device), y.to(device)
    ms = []
    for i in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sync(device)
        if i >= warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-full", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    s = SHAPES[a.shape]
    device = torch.device(a.device)
    fpt_ms = time_steps(s, False, a.warmup, a.steps, device)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    full_ms = None if a.no_full else time_steps(s, True, a.warmup, a.steps, device)
    print(json.dumps({"shape": a.shape, "pytorch_ms": fpt_ms, "pytorch_full_ms": full_ms, "peak_rss_mb": rss,
                      "threads": torch.get_num_threads(), "device": a.device, "torch": torch.__version__,
                      "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
