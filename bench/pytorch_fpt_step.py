#!/usr/bin/env python3
"""The PyTorch reference of `fpt bench`: the same FPT step (frozen backbone; input layer,
output layer, LayerNorms and positions trained; Adam lr 1e-3, clip 1.0, dropouts on) and
the full fine-tune step, timed the same way (median of --steps after --warmup), on
synthetic data, for three backbones:

- gpt2: HF GPT2Model fed inputs_embeds, random init at the shape (shapes tiny, c10, lra,
  listops).
- minilm: HF BertModel with all-MiniLM-L6-v2's config (6 layers x 384, 12 heads, 1536
  MLP), random init (the step's cost does not depend on the weights' values), fed
  inputs_embeds (shapes minilm-mnist, minilm-listops, minilm-bitxor).
- smollm2: HF LlamaModel with SmolLM2-135M's config (30 layers x 576, 9 query / 3 key-value
  heads, SwiGLU 1536) fed inputs_embeds plus fpt's learned position table, random init
  (shape smollm2-mnist); the RMSNorm scales and the table train.
- lstm: the reference code's layer-norm LSTM (`LayerNormLSTM` cells: LayerNorm with the
  unbiased variance on both gate maps and the cell, random initial state), written here in
  PyTorch with the input map and its LayerNorm over all steps at once as fpt does (shapes
  lstm-bitxor, lstm-listops); `nn.LSTM` of the same width and depth (cuDNN/MKL kernels, no
  LayerNorm: a different, cheaper cell) is timed beside it as a lower bound.

    pip install torch transformers
    python3 bench/pytorch_fpt_step.py --shape c10 [--steps 5] [--warmup 2] [--threads 2] [--device cuda]

Prints one JSON object: pytorch_ms, pytorch_full_ms, peak_rss_mb, torch and transformers
versions (and nn_lstm_ms for LSTM shapes). `cargo xtask bench step` runs it when torch and
transformers are importable.
"""
import argparse
import json
import sys
import math
import os
import resource
import statistics
import subprocess
import time

import torch
import transformers

def shapes(fpt):
    """The benchmark shapes as `fpt bench --list` defines them (one source for fpt, xtask and
    this script): name -> dict(arch, layers, hidden, heads, batch, tokens, width, vocab,
    classes, readout, labels)."""
    out = {}
    for e in json.loads(subprocess.run([fpt, "bench", "--list"], check=True, capture_output=True, text=True).stdout):
        inp = e["input"]
        out[e["name"]] = dict(arch=e["arch"], layers=e["layers"], hidden=e["hidden"], heads=e["heads"] or None,
                              batch=e["batch"], tokens=e["tokens"], classes=e["classes"], readout=e["readout"],
                              labels=e["labels"], width=inp.get("width"), vocab=inp.get("vocab"))
    return out


class RefLayerNorm(torch.nn.Module):
    """The reference cell's LayerNorm: unbiased variance, eps inside the square root."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        b = 1.0 / math.sqrt(n)
        self.weight = torch.nn.Parameter(torch.empty(n).uniform_(-b, b))
        self.bias = torch.nn.Parameter(torch.empty(n).uniform_(-b, b))
        self.eps = eps

    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        v = x.var(-1, keepdim=True, unbiased=True)
        return (x - m) / torch.sqrt(v + self.eps) * self.weight + self.bias


class LnLstm(torch.nn.Module):
    """Stacked layer-norm LSTM layers (see crates/fpt-backbones/src/lstm.rs for the cell)."""

    def __init__(self, layers, hidden, dropout=0.1):
        super().__init__()
        self.hidden, self.dropout = hidden, dropout
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            m = torch.nn.Module()
            m.i2h = torch.nn.Linear(hidden, 4 * hidden)
            m.h2h = torch.nn.Linear(hidden, 4 * hidden)
            m.ln_i2h, m.ln_h2h, m.ln_cell = RefLayerNorm(4 * hidden), RefLayerNorm(4 * hidden), RefLayerNorm(hidden)
            self.layers.append(m)

    def forward(self, x):
        b, t, w = x.shape
        hs = self.hidden
        for m in self.layers:
            xi = m.ln_i2h(m.i2h(x))
            std = math.sqrt(2.0 / (w + hs))
            h = torch.randn(b, hs, device=x.device) * std
            c = torch.randn(b, hs, device=x.device) * std
            ys = []
            for s in range(t):
                pre = xi[:, s] + m.ln_h2h(m.h2h(h))
                gates = torch.sigmoid(pre[:, : 3 * hs])
                g = torch.tanh(pre[:, 3 * hs:])
                i, f, o = gates[:, :hs], gates[:, hs:2 * hs], gates[:, 2 * hs:]
                c = m.ln_cell(f * c + i * g)
                h = torch.nn.functional.dropout(o * torch.tanh(c), self.dropout, self.training)
                ys.append(h)
            x = torch.stack(ys, 1)
        return x


class NnLstm(torch.nn.Module):
    def __init__(self, layers, hidden):
        super().__init__()
        self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True, dropout=0.1)

    def forward(self, x):
        return self.lstm(x)[0]


class Fpt(torch.nn.Module):
    def __init__(self, s, full, nn_lstm=False):
        super().__init__()
        arch = s["arch"]
        if arch == "gpt2":
            cfg = transformers.GPT2Config(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"],
                                          n_positions=max(1024, s["tokens"]))
            self.body = transformers.GPT2Model(cfg)
        elif arch == "minilm":
            cfg = transformers.BertConfig(vocab_size=30522, hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                                          num_attention_heads=s["heads"], intermediate_size=4 * s["hidden"],
                                          max_position_embeddings=512, hidden_act="gelu")
            self.body = transformers.BertModel(cfg, add_pooling_layer=False)
        elif arch == "smollm2":
            cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=s["hidden"], intermediate_size=1536,
                                           num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                           num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                                           max_position_embeddings=8192, tie_word_embeddings=True)
            self.body = transformers.LlamaModel(cfg)
            # fpt's own learned position table beside the rotary positions (trained).
            self.pos = torch.nn.Parameter(torch.randn(1024, s["hidden"]) * 0.02)
        elif nn_lstm:
            self.body = NnLstm(s["layers"], s["hidden"])
        else:
            self.body = LnLstm(s["layers"], s["hidden"])
        if s["vocab"]:
            self.inp = torch.nn.Embedding(s["vocab"], s["hidden"])
        else:
            self.inp = torch.nn.Sequential(torch.nn.Linear(s["width"], s["hidden"]), torch.nn.Dropout(0.1))
            torch.nn.init.orthogonal_(self.inp[0].weight, gain=1.41)
            self.inp[0].bias.data.zero_()
        self.readout, self.labels, self.classes = s["readout"], s["labels"], s["classes"]
        self.out = torch.nn.Linear(s["hidden"], s["labels"] * s["classes"] // s["readout"])
        for name, p in self.body.named_parameters():
            n = name.lower()
            if full:
                p.requires_grad = "wte" not in n and "word_embeddings" not in n and "embed_tokens" not in n
            else:
                p.requires_grad = (("ln" in n) or ("wpe" in n) or ("layernorm" in n) or ("position_embeddings" in n)
                                   or (arch == "smollm2" and "norm" in n))
        self.arch = arch

    def forward(self, x):
        e = self.inp(x)
        if self.arch in ("gpt2", "minilm"):
            h = self.body(inputs_embeds=e).last_hidden_state
        elif self.arch == "smollm2":
            h = self.body(inputs_embeds=e + self.pos[: e.shape[1]]).last_hidden_state
        else:
            h = self.body(e)
        y = self.out(h[:, -self.readout:])
        return y.reshape(-1, self.classes)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stepper:
    """One model, optimizer and batch at a shape, stepped on demand: `run(warmup, steps)`
    returns each timed step's milliseconds. On a GPU each step is timed with CUDA events
    (recorded on the stream around the step, read after a synchronize); on a CPU with the
    wall clock. `autocast="bf16"`: the forward and loss under torch.autocast(bfloat16),
    PyTorch's mixed precision (its weights stay f32 and are cast at each use)."""

    def __init__(self, s, full, device, nn_lstm=False, autocast=None):
        torch.manual_seed(0)
        self.device, self.autocast = device, autocast
        self.model = Fpt(s, full, nn_lstm).train().to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.Adam(self.params, lr=1e-3)
        if s["vocab"]:
            x = torch.randint(0, s["vocab"], (s["batch"], s["tokens"]))
        else:
            x = torch.randn(s["batch"], s["tokens"], s["width"])
        y = torch.randint(0, s["classes"], (s["batch"] * s["labels"],))
        self.x, self.y = x.to(device), y.to(device)

    def step(self):
        if self.autocast:
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        else:
            loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()

    def run(self, warmup, steps, gate=None):
        """The timed steps' milliseconds; `gate` (a callable) runs between the warm-up and
        them, and the timed window's wall clock is kept in `self.window`."""
        cuda = self.device.type == "cuda"
        ms = []
        from_unix = time.time()
        for i in range(warmup + steps):
            if i == warmup:
                if gate:
                    gate()
                sync(self.device)
                from_unix = time.time()
            sync(self.device)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            self.step()
            if cuda:
                end.record()
            sync(self.device)
            if i >= warmup:
                ms.append(start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1e3)
        self.window = (from_unix, time.time())
        return ms


def barrier(directory, count, timeout=900.0):
    """What `fpt bench --barrier DIR --at-once N` does: write ready-<pid> into `directory`,
    then wait until `count` processes have, so their timed steps overlap."""
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, f"ready-{os.getpid()}"), "w").close()
    start = time.time()
    while True:
        ready = sum(1 for n in os.listdir(directory) if n.startswith("ready-"))
        if ready >= count:
            return
        if time.time() - start > timeout:
            sys.exit(f"{directory}: {ready} of {count} processes timed at once were ready after {timeout:.0f} s")
        time.sleep(0.005)


def time_steps(s, full, warmup, steps, device, nn_lstm=False, autocast=None, profile=None, gate=None, window=None):
    """Median step time (ms) of a fresh [`Stepper`]; its timed window appended to `window`."""
    st = Stepper(s, full, device, nn_lstm=nn_lstm, autocast=autocast)
    model, params, opt, x, y = st.model, st.params, st.opt, st.x, st.y
    ms = st.run(warmup, steps, gate)
    if window is not None:
        window.extend(st.window)
    if profile:
        # One more step under the profiler: its kernels, grouped by name, by device time.
        from torch.profiler import ProfilerActivity, profile as torch_profile
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sync(device)
        with open(profile, "w") as f:
            try:
                events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                f.write(f"{len(events)} device kernels/copies in one step; "
                        f"{sum(getattr(e, 'device_time', 0.0) for e in events) / 1e3:.2f} ms of device time\n")
            except Exception as e:  # the table below is what matters
                f.write(f"(kernel count unavailable: {e})\n")
            f.write(prof.key_averages().table(sort_by="device_time_total", row_limit=30))
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True)
    ap.add_argument("--fpt", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "fpt"),
                    help="the fpt binary whose `bench --list` defines the shapes")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-full", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--autocast", choices=["bf16"], help="time the step under torch.autocast(bfloat16) (no full step)")
    ap.add_argument("--profile", help="write one FPT step's device kernels (torch.profiler) to this file")
    ap.add_argument("--barrier", help="several processes timed at once: after its warm-up each writes ready-<pid> "
                                      "here and waits until --at-once have (as fpt bench --barrier does)")
    ap.add_argument("--at-once", type=int, default=0, help="how many processes share --barrier")
    ap.add_argument("--serve", action="store_true",
                    help="build the FPT step once, then time `--warmup` + `--steps` steps for every line read on "
                         "stdin, answering one JSON line each ({\"pytorch_ms\": median, \"steps_ms\": [...]}): "
                         "rounds alternated with fpt's own (fpt gpu-check) without rebuilding")
    a = ap.parse_args()
    if bool(a.barrier) != (a.at_once > 0):
        ap.error("--barrier and --at-once go together")
    if a.threads:
        torch.set_num_threads(a.threads)
    known = shapes(a.fpt)
    if a.shape not in known:
        ap.error(f"unknown --shape {a.shape} (known: {', '.join(sorted(known))})")
    s = known[a.shape]
    device = torch.device(a.device)
    if a.serve:
        st = Stepper(s, False, device, autocast=a.autocast)
        for _ in sys.stdin:
            ms = st.run(a.warmup, a.steps)
            print(json.dumps({"shape": a.shape, "pytorch_ms": statistics.median(ms), "steps_ms": ms,
                              "autocast": a.autocast, "device": a.device, "torch": torch.__version__,
                              "timer": "cuda-events" if device.type == "cuda" else "wall-clock"}), flush=True)
        return
    gate = (lambda: barrier(a.barrier, a.at_once)) if a.barrier else None
    window = []
    fpt_ms = time_steps(s, False, a.warmup, a.steps, device, autocast=a.autocast, profile=a.profile, gate=gate,
                        window=window)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    full_ms = None if a.no_full or a.autocast else time_steps(s, True, a.warmup, a.steps, device)
    out = {"shape": a.shape, "backbone": s["arch"], "pytorch_ms": fpt_ms, "pytorch_full_ms": full_ms,
           "autocast": a.autocast, "from_unix": window[0], "to_unix": window[1],
           "peak_rss_mb": rss, "threads": torch.get_num_threads(), "device": a.device, "torch": torch.__version__,
           "transformers": transformers.__version__}
    if s["arch"] == "lstm":
        out["nn_lstm_ms"] = time_steps(s, False, a.warmup, a.steps, device, nn_lstm=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
