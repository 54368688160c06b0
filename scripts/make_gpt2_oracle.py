#!/usr/bin/env python3
# Builds the PyTorch oracle for backend/: a tiny GPT-2 written by hand in torch (HF GPT-2 math: tanh GELU,
# layer-norm eps 1e-5, causal mask, scores / sqrt(head_dim), LM head tied to wte, no dropout), its initial
# weights (HF names, Conv1D [in, out] layout), llm.c token files, and ~5 steps of torch.optim.AdamW:
# per-step losses, step-0 gradients and final weights. The committed outputs are the oracle; CI never
# needs torch. Then the same run in bf16 mixed precision (harmony's semantics, docs/backend.md "Mixed
# precision"): bf16 weights, activations and gradients, fp32 master weights and AdamW (forward_bf16, main_bf16).
# Usage (Debian 12: apt-get install python3-torch):
#   /usr/bin/python3 scripts/make_gpt2_oracle.py [OUT_DIR [BF16_OUT_DIR]]
#   (default tests/data/gpt2_tiny and tests/data/gpt2_tiny_bf16)
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

CONFIG = dict(vocab_size=128, n_positions=32, n_layer=2, n_head=2, n_embd=32)
B, T, STEPS = 4, 16, 5
# eps 1e-5 rather than torch's default 1e-8: Adam's update moves by up to lr/eps per unit of gradient error
# where |g| << eps, and some gradients are pure rounding noise on both sides (the key third of c_attn.bias
# has an exactly zero true gradient: softmax ignores q.b_k, constant along a row). With 1e-8 that noise
# becomes ~7e-6 weight differences; with 1e-5 every weight agrees to ~3e-7 (docs/backend.md, Tolerances).
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1)
SEED = 1234
NUM_TOKENS = (STEPS + 1) * B * T + 1


def init_params(cfg, gen):
    """GPT-2 initialisation (normal(0, 0.02), c_proj scaled by 1/sqrt(2 n_layer)), with biases and layer-norm
    parameters perturbed away from 0 and 1 so that their gradients are exercised too. Ordered as HF names."""
    V, P, L, C = cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"], cfg["n_embd"]

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    p = {"wte.weight": normal(V, C), "wpe.weight": normal(P, C, std=0.01)}
    proj_std = 0.02 / math.sqrt(2 * L)
    for i in range(L):
        h = f"h.{i}."
        p[h + "ln_1.weight"] = 1.0 + normal(C, std=0.1)
        p[h + "ln_1.bias"] = normal(C)
        p[h + "attn.c_attn.weight"] = normal(C, 3 * C)  # Conv1D: [in, out]
        p[h + "attn.c_attn.bias"] = normal(3 * C)
        p[h + "attn.c_proj.weight"] = normal(C, C, std=proj_std)
        p[h + "attn.c_proj.bias"] = normal(C)
        p[h + "ln_2.weight"] = 1.0 + normal(C, std=0.1)
        p[h + "ln_2.bias"] = normal(C)
        p[h + "mlp.c_fc.weight"] = normal(C, 4 * C)
        p[h + "mlp.c_fc.bias"] = normal(4 * C)
        p[h + "mlp.c_proj.weight"] = normal(4 * C, C, std=proj_std)
        p[h + "mlp.c_proj.bias"] = normal(C)
    p["ln_f.weight"] = 1.0 + normal(C, std=0.1)
    p["ln_f.bias"] = normal(C)
    return {k: torch.nn.Parameter(v.contiguous()) for k, v in p.items()}


def gelu_new(x):  # transformers.activations.NewGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, w, b):  # transformers.pytorch_utils.Conv1D: x @ w + b with w [in, out]
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])


def forward(p, cfg, idx, targets):
    L, H, C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    Bn, Tn = idx.shape
    hs = C // H
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(Tn)]
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool)).view(1, 1, Tn, Tn)
    for i in range(L):
        h = f"h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = conv1d(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(Bn, Tn, H, hs).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], hs**0.5, dtype=torch.float32)
        w = torch.where(mask, w, torch.full([], torch.finfo(torch.float32).min, dtype=torch.float32))
        w = torch.softmax(w, dim=-1)
        y = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(Bn, Tn, C)
        x = x + conv1d(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        m = gelu_new(conv1d(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]))
        x = x + conv1d(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
    logits = torch.matmul(x, p["wte.weight"].t())  # lm_head tied to wte, no bias
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def forward_bf16(p, cfg, idx, targets):
    """The model in bf16 as harmony's bf16 kernels compute it: `p` holds bf16 tensors (the rounded fp32 masters;
    "lm_head.weight" a separate bf16 copy of wte, as the head's own block on the device, so its gradient stays
    separate until the host adds the two in fp32). Every op reads bf16, computes in fp32 and rounds its output to
    bf16 once: torch's bf16 CPU matmul/addmm (fp32 accumulation, one rounding) and adds do exactly that; torch
    1.13's bf16 layer_norm and GELU do not (they round intermediate steps: 60% and 40% of outputs differ from
    the once-rounded value), so those, attention and the cross-entropy run in fp32 on the widened bf16 inputs
    with the output rounded once (ln), as our kernels compute them; the per-token losses stay fp32. The
    backward of each widening (.float()) rounds the fp32 gradient to bf16 once, as our backward kernels store
    it. Remaining differences: torch keeps layer-norm mean/rstd and the attention probabilities in fp32 for
    the backward (ours are stored bf16), and sums the few ops' gradients in a different order."""
    L, H, C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    Bn, Tn = idx.shape
    hs = C // H
    bf = torch.bfloat16

    def ln(t, w, b):  # fp32 on the widened inputs, rounded once
        return F.layer_norm(t.float(), (C,), w.float(), b.float(), eps=1e-5).to(bf)

    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(Tn)]
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool)).view(1, 1, Tn, Tn)
    for i in range(L):
        h = f"h.{i}."
        a = ln(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        qkv = conv1d(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])
        q, k, v = qkv.float().split(C, dim=2)
        q, k, v = (t.view(Bn, Tn, H, hs).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], hs**0.5, dtype=torch.float32)
        w = torch.where(mask, w, torch.full([], torch.finfo(torch.float32).min, dtype=torch.float32))
        w = torch.softmax(w, dim=-1)
        y = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(Bn, Tn, C).to(bf)
        x = x + conv1d(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = ln(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        m = gelu_new(conv1d(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]).float()).to(bf)
        x = x + conv1d(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    x = ln(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = torch.matmul(x, p["lm_head.weight"].t())  # bf16, fp32 accumulation
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main_bf16(out, masters, tokens, cfg, meta, fp32_dir):
    """bf16 mixed precision from the same initial weights and tokens: per step the fp32 masters are rounded to
    bf16 (nearest even, torch's .to(bfloat16)), forward and backward run in bf16 (forward_bf16), the bf16
    gradients are widened to fp32 (wte: embedding + LM head contributions added in fp32) and torch.optim.AdamW
    updates the fp32 masters. Writes step-0 gradients (the widened bf16 values), final fp32 masters and losses."""
    os.makedirs(out, exist_ok=True)
    opt = torch.optim.AdamW(list(masters.values()), lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    data = torch.tensor(tokens, dtype=torch.long)
    losses = []
    for step in range(STEPS):
        chunk = data[step * B * T:step * B * T + B * T + 1]
        idx, tgt = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        dev = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in masters.items()}
        dev["lm_head.weight"] = masters["wte.weight"].detach().to(torch.bfloat16).requires_grad_()
        loss = forward_bf16(dev, cfg, idx, tgt)
        loss.backward()
        for k, v in masters.items():
            v.grad = dev[k].grad.float()
        masters["wte.weight"].grad = masters["wte.weight"].grad + dev["lm_head.weight"].grad.float()
        if step == 0:
            write_safetensors(os.path.join(out, "grads_step0.safetensors"), {k: v.grad
                                                                           for k, v in masters.items()}, meta)
        losses.append(float(loss.item()))
        opt.step()
    write_safetensors(os.path.join(out, "final.safetensors"), masters, meta)
    rel = os.path.relpath(fp32_dir, out)
    oracle = {
        "description": "tiny GPT-2 in bf16 mixed precision (bf16 weights/activations/gradients, fp32 masters and "
                       "torch.optim.AdamW) by scripts/make_gpt2_oracle.py",
        "torch_version": torch.__version__,
        "dtype": "bf16",
        "seed": SEED,
        "config": cfg,
        "layer_norm_eps": 1e-5,
        "batch_size": B,
        "seq_len": T,
        "steps": STEPS,
        "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1], "eps": ADAMW["eps"],
                  "weight_decay": ADAMW["weight_decay"]},
        "losses": losses,
        "initial_weights": rel + "/model.safetensors",
        "grads_step0": "grads_step0.safetensors",
        "final_weights": "final.safetensors",
        "tokens": {"with_header": rel + "/tokens.bin", "raw": rel + "/tokens_raw.bin", "count": len(tokens)},
    }
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump(oracle, f, indent=2)
        f.write("\n")
    print("bf16 losses:", " ".join(f"{x:.6f}" for x in losses))


def write_safetensors(path, tensors, metadata):
    """safetensors by hand: u64 LE header length, JSON header (space-padded to 8 bytes), raw LE F32 data."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_tokens(path, tokens, header):
    """llm.c format: optional 1024-byte header (int32 magic 20240520, version 1, token count), uint16 LE ids."""
    with open(path, "wb") as f:
        if header:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def make_tokens(gen, n, vocab):
    """A learnable stream: mostly t' = (5 t + 3) mod V, sometimes a random token."""
    toks = [int(torch.randint(vocab, (1,), generator=gen))]
    for _ in range(n - 1):
        if float(torch.rand(1, generator=gen)) < 0.2:
            toks.append(int(torch.randint(vocab, (1,), generator=gen)))
        else:
            toks.append((5 * toks[-1] + 3) % vocab)
    return toks


def main():
    data_dir = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(data_dir, "gpt2_tiny")
    out_bf16 = sys.argv[2] if len(sys.argv) > 2 else os.path.join(data_dir, "gpt2_tiny_bf16")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(SEED)
    cfg = CONFIG
    params = init_params(cfg, gen)
    tokens = make_tokens(gen, NUM_TOKENS, cfg["vocab_size"])
    masters = {k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()}  # for main_bf16
    meta = {"format": "pt", "n_head": str(cfg["n_head"])}

    write_safetensors(os.path.join(out, "model.safetensors"), params, meta)
    write_tokens(os.path.join(out, "tokens.bin"), tokens, header=True)
    write_tokens(os.path.join(out, "tokens_raw.bin"), tokens, header=False)

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

    oracle = {
        "description": "tiny GPT-2 trained with torch.optim.AdamW by scripts/make_gpt2_oracle.py",
        "torch_version": torch.__version__,
        "seed": SEED,
        "config": cfg,
        "layer_norm_eps": 1e-5,
        "batch_size": B,
        "seq_len": T,
        "steps": STEPS,
        "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1], "eps": ADAMW["eps"],
                  "weight_decay": ADAMW["weight_decay"]},
        "losses": losses,
        "initial_weights": "model.safetensors",
        "grads_step0": "grads_step0.safetensors",
        "final_weights": "final.safetensors",
        "tokens": {"with_header": "tokens.bin", "raw": "tokens_raw.bin", "count": len(tokens)},
    }
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump(oracle, f, indent=2)
        f.write("\n")
    print("losses:", " ".join(f"{x:.6f}" for x in losses))
    main_bf16(out_bf16, masters, tokens, cfg, meta, out)


if __name__ == "__main__":
    main()
