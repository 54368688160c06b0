#!/usr/bin/env python3
# Builds the PyTorch oracle for harmony-run's Llama-family block: a tiny Llama written by hand in torch (HF
# LlamaForCausalLM math without transformers: RMSNorm as LlamaRMSNorm, rotary embeddings with rotate_half and
# inv_freq = 1 / theta^(2i/D) in fp32, grouped-query attention by repeat_kv, causal softmax(q.k / sqrt(D)), SwiGLU
# MLP silu(gate) * up, untied lm_head, no biases, no dropout), its initial weights (HF names, nn.Linear [out, in]),
# and 5 steps of torch.optim.AdamW on gpt2_tiny's token file: per-step losses, step-0 gradients and final weights.
# The committed outputs are the oracle (tests/backend/test_oracle_llama.cpp); CI never needs torch.
# Usage (Debian 12: apt-get install python3-torch):
#   /usr/bin/python3 scripts/make_llama_oracle.py [OUT_DIR [BF16_OUT_DIR]]
#   (default tests/data/llama_tiny and tests/data/llama_tiny_bf16: the same run in bf16 mixed precision, losses and
#   step-0 gradients)
#   /usr/bin/python3 scripts/make_llama_oracle.py --qwen2 [OUT_DIR]
#   (default tests/data/qwen2_tiny: the same model as Qwen2 writes it, model_type qwen2, with biases on q_proj, k_proj
#   and v_proj (Qwen2Attention's; o_proj and the MLP have none), drawn normal(0, 0.02) so that they matter; fp32 only)
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from make_gpt2_oracle import ADAMW, B, STEPS, T, write_safetensors  # noqa: E402  (the same run as GPT-2's)

# HF LlamaConfig keys. H = 4 query heads over 2 key/value heads (GQA), head width 8; intermediate_size 48 (not 4C).
CONFIG = dict(model_type="llama", vocab_size=128, max_position_embeddings=32, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=48,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
              attention_bias=False, mlp_bias=False)
SEED = 4321
# Qwen2Config keys (Qwen2 has no attention_bias key: its q, k and v projections always carry biases).
QWEN2_CONFIG = dict(model_type="qwen2", vocab_size=128, max_position_embeddings=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                    use_sliding_window=False, sliding_window=32, max_window_layers=2, attention_dropout=0.0)


def init_params(cfg, gen):
    """normal(0, 0.02), o_proj/down_proj scaled by 1/sqrt(2 L), norm weights perturbed away from 1 so their gradients
    are exercised. Ordered as HF names."""
    V, L, C, I = cfg["vocab_size"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    KV = cfg["num_key_value_heads"] * (C // cfg["num_attention_heads"])

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    proj_std = 0.02 / math.sqrt(2 * L)
    p = {"model.embed_tokens.weight": normal(V, C)}
    for i in range(L):
        h = f"model.layers.{i}."
        p[h + "input_layernorm.weight"] = 1.0 + normal(C, std=0.1)
        p[h + "self_attn.q_proj.weight"] = normal(C, C)
        p[h + "self_attn.k_proj.weight"] = normal(KV, C)
        p[h + "self_attn.v_proj.weight"] = normal(KV, C)
        if cfg["model_type"] == "qwen2":
            p[h + "self_attn.q_proj.bias"] = normal(C)
            p[h + "self_attn.k_proj.bias"] = normal(KV)
            p[h + "self_attn.v_proj.bias"] = normal(KV)
        p[h + "self_attn.o_proj.weight"] = normal(C, C, std=proj_std)
        p[h + "post_attention_layernorm.weight"] = 1.0 + normal(C, std=0.1)
        p[h + "mlp.gate_proj.weight"] = normal(I, C)
        p[h + "mlp.up_proj.weight"] = normal(I, C)
        p[h + "mlp.down_proj.weight"] = normal(C, I, std=proj_std)
    p["model.norm.weight"] = 1.0 + normal(C, std=0.1)
    p["lm_head.weight"] = normal(V, C)
    return {k: torch.nn.Parameter(v.contiguous()) for k, v in p.items()}


def rms_norm(x, w, eps):  # LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(Tn, D, theta):  # LlamaRotaryEmbedding (fp32)
    inv_freq = 1.0 / (theta**(torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(Tn, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def forward(p, cfg, idx, targets):
    L, H, Hkv, C = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    eps = cfg["rms_norm_eps"]
    Bn, Tn = idx.shape
    D = C // H
    cos, sin = rope_cos_sin(Tn, D, cfg["rope_theta"])
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool)).view(1, 1, Tn, Tn)
    x = p["model.embed_tokens.weight"][idx]
    for i in range(L):
        h = f"model.layers.{i}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = F.linear(a, p[h + "self_attn.q_proj.weight"], p.get(h + "self_attn.q_proj.bias"))
        k = F.linear(a, p[h + "self_attn.k_proj.weight"], p.get(h + "self_attn.k_proj.bias"))
        v = F.linear(a, p[h + "self_attn.v_proj.weight"], p.get(h + "self_attn.v_proj.bias"))
        q = q.view(Bn, Tn, H, D).transpose(1, 2)
        k = k.view(Bn, Tn, Hkv, D).transpose(1, 2)
        v = v.view(Bn, Tn, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // Hkv, dim=1)  # repeat_kv
        v = v.repeat_interleave(H // Hkv, dim=1)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], D**0.5, dtype=torch.float32)
        w = torch.where(mask, w, torch.full([], torch.finfo(torch.float32).min, dtype=torch.float32))
        w = torch.softmax(w, dim=-1)
        y = torch.matmul(w, v).transpose(1, 2).contiguous().view(Bn, Tn, C)
        x = x + F.linear(y, p[h + "self_attn.o_proj.weight"])
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        m = F.silu(F.linear(m, p[h + "mlp.gate_proj.weight"])) * F.linear(m, p[h + "mlp.up_proj.weight"])
        x = x + F.linear(m, p[h + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], eps)
    logits = F.linear(x, p["lm_head.weight"])
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def forward_bf16(p, cfg, idx, targets):
    """The model in bf16 as harmony's bf16 kernels compute it (make_gpt2_oracle.py's forward_bf16): `p` holds the
    bf16-rounded fp32 masters; matmuls and adds are torch's bf16 ops (fp32 accumulation, one rounding); RMSNorm,
    rotary embeddings, attention, SwiGLU and the cross-entropy run in fp32 on the widened bf16 inputs with each
    output rounded to bf16 once, as our kernels store them."""
    L, H, Hkv, C = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    eps = cfg["rms_norm_eps"]
    Bn, Tn = idx.shape
    D = C // H
    bf = torch.bfloat16
    cos, sin = rope_cos_sin(Tn, D, cfg["rope_theta"])
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool)).view(1, 1, Tn, Tn)

    def norm(t, w):
        return rms_norm(t.float(), w.float(), eps).to(bf)

    x = p["model.embed_tokens.weight"][idx]
    for i in range(L):
        h = f"model.layers.{i}."
        a = norm(x, p[h + "input_layernorm.weight"])
        q = F.linear(a, p[h + "self_attn.q_proj.weight"]).float().view(Bn, Tn, H, D).transpose(1, 2)
        k = F.linear(a, p[h + "self_attn.k_proj.weight"]).float().view(Bn, Tn, Hkv, D).transpose(1, 2)
        v = F.linear(a, p[h + "self_attn.v_proj.weight"]).float().view(Bn, Tn, Hkv, D).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(bf).float()  # rope_qkv_fwd stores bf16
        k = (k * cos + rotate_half(k) * sin).to(bf).float()
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], D**0.5, dtype=torch.float32)
        w = torch.where(mask, w, torch.full([], torch.finfo(torch.float32).min, dtype=torch.float32))
        w = torch.softmax(w, dim=-1)
        y = torch.matmul(w, v).transpose(1, 2).contiguous().view(Bn, Tn, C).to(bf)
        x = x + F.linear(y, p[h + "self_attn.o_proj.weight"])
        m = norm(x, p[h + "post_attention_layernorm.weight"])
        g = F.linear(m, p[h + "mlp.gate_proj.weight"]).float()
        u = F.linear(m, p[h + "mlp.up_proj.weight"]).float()
        x = x + F.linear((F.silu(g) * u).to(bf), p[h + "mlp.down_proj.weight"])
    x = norm(x, p["model.norm.weight"])
    logits = F.linear(x, p["lm_head.weight"])
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main_bf16(out, masters, tokens, cfg, fp32_dir, tokens_rel):
    """bf16 mixed precision from the same initial weights and tokens (make_gpt2_oracle.py's main_bf16, untied):
    per step the fp32 masters are rounded to bf16, forward and backward run in bf16, the bf16 gradients are widened
    and torch.optim.AdamW updates the fp32 masters. Writes step-0 gradients and the losses."""
    os.makedirs(out, exist_ok=True)
    opt = torch.optim.AdamW(list(masters.values()), lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    data = torch.tensor(tokens, dtype=torch.long)
    losses = []
    for step in range(STEPS):
        chunk = data[step * B * T:step * B * T + B * T + 1]
        idx, tgt = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        dev = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in masters.items()}
        loss = forward_bf16(dev, cfg, idx, tgt)
        loss.backward()
        for k, v in masters.items():
            v.grad = dev[k].grad.float()
        if step == 0:
            write_safetensors(os.path.join(out, "grads_step0.safetensors"), {k: v.grad
                                                                           for k, v in masters.items()}, {})
        losses.append(float(loss.item()))
        opt.step()
    oracle = {
        "description": "tiny Llama in bf16 mixed precision (bf16 weights/activations/gradients, fp32 masters and "
                       "torch.optim.AdamW) by scripts/make_llama_oracle.py",
        "torch_version": torch.__version__,
        "dtype": "bf16",
        "batch_size": B,
        "seq_len": T,
        "steps": STEPS,
        "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1], "eps": ADAMW["eps"],
                  "weight_decay": ADAMW["weight_decay"]},
        "losses": losses,
        "initial_weights": os.path.relpath(fp32_dir, out),
        "grads_step0": "grads_step0.safetensors",
        "tokens": {"with_header": os.path.relpath(os.path.join(out, tokens_rel), out), "count": len(tokens)},
    }
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump(oracle, f, indent=2)
        f.write("\n")
    print("bf16 losses:", " ".join(f"{x:.6f}" for x in losses))


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()[1024:]
    return list(int.from_bytes(data[i:i + 2], "little") for i in range(0, len(data), 2))


def main():
    data_dir = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    args = sys.argv[1:]
    qwen2 = "--qwen2" in args
    args = [a for a in args if a != "--qwen2"]
    out = args[0] if args else os.path.join(data_dir, "qwen2_tiny" if qwen2 else "llama_tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(SEED)
    cfg = QWEN2_CONFIG if qwen2 else CONFIG
    params = init_params(cfg, gen)
    masters = {k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()}  # for main_bf16
    tokens_dir = os.path.join(data_dir, "gpt2_tiny")
    tokens = read_tokens(os.path.join(tokens_dir, "tokens.bin"))
    assert len(tokens) >= STEPS * B * T + 1 and max(tokens) < cfg["vocab_size"]
    meta = {"format": "pt"}
    write_safetensors(os.path.join(out, "model.safetensors"), params, meta)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(architectures=["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"], **cfg), f, indent=2)
        f.write("\n")

    opt = torch.optim.AdamW(list(params.values()), lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    data = torch.tensor(tokens, dtype=torch.long)
    losses = []
    for step in range(STEPS):
        chunk = data[step * B * T:step * B * T + B * T + 1]
        idx, tgt = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        opt.zero_grad(set_to_none=True)
        loss = forward(params, cfg, idx, tgt)
        loss.backward()
        if step == 0:
            write_safetensors(os.path.join(out, "grads_step0.safetensors"), {k: v.grad
                                                                           for k, v in params.items()}, meta)
        losses.append(float(loss.item()))
        opt.step()
    write_safetensors(os.path.join(out, "final.safetensors"), params, meta)
    rel = os.path.relpath(tokens_dir, out)
    oracle = {
        "description": ("tiny Qwen2 (q/k/v biases, " if qwen2 else "tiny Llama (") +
                       "GQA, SwiGLU, RoPE, untied head) trained with torch.optim.AdamW by scripts/make_llama_oracle.py" +
                       (" --qwen2" if qwen2 else ""),
        "torch_version": torch.__version__,
        "seed": SEED,
        "config": cfg,
        "batch_size": B,
        "seq_len": T,
        "steps": STEPS,
        "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1], "eps": ADAMW["eps"],
                  "weight_decay": ADAMW["weight_decay"]},
        "losses": losses,
        "initial_weights": "model.safetensors",
        "grads_step0": "grads_step0.safetensors",
        "final_weights": "final.safetensors",
        "tokens": {"with_header": rel + "/tokens.bin", "count": len(tokens)},
    }
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump(oracle, f, indent=2)
        f.write("\n")
    print("losses:", " ".join(f"{x:.6f}" for x in losses))
    if qwen2:
        return
    out_bf16 = args[1] if len(args) > 1 else os.path.join(data_dir, "llama_tiny_bf16")
    main_bf16(out_bf16, masters, tokens, cfg, out, os.path.relpath(os.path.join(tokens_dir, "tokens.bin"), out_bf16))


if __name__ == "__main__":
    main()
