#!/usr/bin/env python3
# PyTorch beside harmony-run (issue 34): the same GPT-2 (HF GPT-2 math as backend/ implements it: tanh GELU,
# LayerNorm eps 1e-5, causal attention scaled by 1/sqrt(head size), LM head tied to wte, no dropout) trained in
# plain PyTorch from the same safetensors file, on the same llm.c token file in the same order (step k reads
# B*T+1 tokens from (k mod steps_per_epoch)*B*T, as backend/tokens.hpp), with torch.optim.AdamW at a constant lr.
# Prints one JSON document: per-step loss and step time (CUDA-synchronised), throughput, peak memory, the settings
# and every fallback it took. gpu-check.sh runs it on the GPU (bf16 autocast, fused AdamW, SDPA, optionally
# torch.compile; then capped to Harmony's memory, where running out of memory is the result, exit 0);
# tests/cli/test_torch_side_by_side.py runs it in CI on a tiny model on Debian's python3-torch 1.13 (CPU, fp32:
# no SDPA, no fused AdamW, both named in "fallbacks") against harmony-run's CPU device.
#
# usage:
#   torch_side_by_side.py init --vocab-size V --n-positions P --n-layer L --n-head H --n-embd C [--seed S] --out F
#       GPT-2's initialisation (as backend/model/state.cpp: normal(0, 0.02), c_proj.weight 0.02/sqrt(2L),
#       LayerNorm weights 1, biases 0) drawn from torch's generator, written as F32 HF safetensors (Conv1D
#       [in, out] layout, metadata n_head) that harmony-run loads with model.weights: F
#   torch_side_by_side.py tokens --vocab-size V --count N [--seed S] --out F
#       harmony-run's synthetic task ({synthetic_tokens: N, seed: S}, backend/tokens.cpp: splitmix64, a Markov
#       chain with 4 successors per token) written as an llm.c token file, token for token the same stream
#   torch_side_by_side.py train --weights F --data F --seq-len T --batch B [--microbatch U] --steps N
#       [--lr 1e-3 --beta1 0.9 --beta2 0.999 --eps 1e-8 --weight-decay 0] [--device auto|cpu|cuda]
#       [--dtype fp32|bf16] [--attention auto|sdpa|manual] [--adamw auto|fused|foreach|for-loop] [--compile]
#       [--compile-budget-s S] [--memory-cap BYTES] [--n-head H] [--threads N] [--peak-tflops X]
#       [--simulate-oom-at-step K]  (raises the CUDA out-of-memory error at step K: tests the report without a GPU)
# Exit 0 with the JSON (also when the run ran out of memory: "trains": false); 2 for bad input, with the reason.
import argparse
import ctypes
import json
import math
import os
import platform
import struct
import sys
import time

TOKEN_MAGIC = 20240520
TOKEN_HEADER_BYTES = 1024
SYNTHETIC_SUCCESSORS = 4  # backend::TokenFile::kSyntheticSuccessors
MASK64 = (1 << 64) - 1


class InputError(Exception):
    """Bad input: printed as `torch_side_by_side: error: ...`, exit 2."""


# --- token files ---------------------------------------------------------------------------------------------------
def splitmix64(state):
    """(new state, output): backend/tokens.cpp's splitmix64, in 64-bit unsigned arithmetic."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def synthetic_tokens(vocab, count, seed):
    """backend::TokenFile::synthetic(vocab, count, seed), token for token."""
    if not 2 <= vocab <= 65536:
        raise InputError(f"--vocab-size {vocab} outside [2, 65536]")
    if count < 2:
        raise InputError(f"--count {count}: need at least 2 tokens")
    state = seed & MASK64
    nxt = []
    for _ in range(vocab * SYNTHETIC_SUCCESSORS):
        state, z = splitmix64(state)
        nxt.append(z % vocab)
    state, z = splitmix64(state)
    cur = z % vocab
    out = [0] * count
    for i in range(count):
        out[i] = cur
        state, z = splitmix64(state)
        cur = nxt[cur * SYNTHETIC_SUCCESSORS + z % SYNTHETIC_SUCCESSORS]
    return out


def write_tokens(path, tokens):
    """llm.c format with its header (int32 magic, version 1, count; 1024 bytes), uint16 LE ids."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", TOKEN_MAGIC, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def read_tokens(path):
    """The token ids of an llm.c file, header optional (the rules of backend/tokens.cpp)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot open the token file: {e.strerror}")
    start = 0
    if len(data) >= TOKEN_HEADER_BYTES and struct.unpack_from("<i", data, 0)[0] == TOKEN_MAGIC:
        _, version, count = struct.unpack_from("<3i", data, 0)
        if version != 1:
            raise InputError(f"{path}: llm.c header version {version} is not supported (version 1: uint16 tokens)")
        if count != (len(data) - TOKEN_HEADER_BYTES) // 2 or (len(data) - TOKEN_HEADER_BYTES) % 2:
            raise InputError(f"{path}: header says {count} tokens but the file holds "
                             f"{(len(data) - TOKEN_HEADER_BYTES) / 2:g} (truncated file?)")
        start = TOKEN_HEADER_BYTES
    elif len(data) % 2:
        raise InputError(f"{path}: {len(data)} bytes is not a whole number of uint16 tokens")
    n = (len(data) - start) // 2
    return list(struct.unpack_from(f"<{n}H", data, start))


def batch(tokens, step, B, T):
    """Step `step`'s (inputs, targets) as lists of B*T ids: backend::TokenFile::batch (llm.c's wrap-around)."""
    bt = B * T
    if len(tokens) < bt + 1:
        raise InputError(f"a {B}x{T} batch needs {bt + 1} tokens, the file has {len(tokens)}")
    start = (step % ((len(tokens) - 1) // bt)) * bt
    return tokens[start:start + bt], tokens[start + 1:start + bt + 1]


# --- safetensors ---------------------------------------------------------------------------------------------------
def tensor_bytes(t):
    """The raw bytes of a contiguous CPU tensor (no numpy: a pip torch may come without it)."""
    t = t.detach().contiguous().cpu()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def write_safetensors(path, tensors, metadata):
    """u64 LE header length, JSON header (space-padded to 8 bytes), raw LE F32 data."""
    import torch
    header, offset = {"__metadata__": metadata}, 0
    for name, t in tensors.items():
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in tensors.values():
            f.write(tensor_bytes(t.to(torch.float32)))
    os.replace(tmp, path)


def read_safetensors(path):
    """(name -> fp32 CPU tensor, metadata); F32, F16 and BF16 (widened), as harmony-run reads them."""
    try:
        with open(path, "rb") as f:
            data = bytearray(f.read())
    except OSError as e:
        raise InputError(f"{path}: cannot open the weights: {e.strerror}")
    if len(data) < 8:
        raise InputError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack_from("<Q", data, 0)
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except ValueError as e:
        raise InputError(f"{path}: the safetensors header is not JSON: {e}")
    if not isinstance(header, dict):
        raise InputError(f"{path}: the safetensors header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    import torch  # only now: a file that is not safetensors is refused without the seconds torch takes to load
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    out = {}
    for name, h in header.items():
        if h["dtype"] not in dtypes:
            raise InputError(f"{path}: tensor {name} is {h['dtype']}; F32, F16 or BF16 expected")
        a, b = h["data_offsets"]
        dt = dtypes[h["dtype"]]
        count = (b - a) // torch.tensor([], dtype=dt).element_size()
        t = torch.frombuffer(data, dtype=dt, count=count, offset=8 + n + a) if count else torch.empty(0, dtype=dt)
        out[name] = t.reshape(h["shape"]).to(torch.float32).clone()
    return out, meta


# --- the model -----------------------------------------------------------------------------------------------------
BLOCK_PARAMS = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias"]


def hf_shapes(V, P, L, C):
    """HF GPT-2 tensor names and shapes (Conv1D weights [in, out]) in file order."""
    s = {"wte.weight": [V, C], "wpe.weight": [P, C]}
    per = {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C], "attn.c_attn.bias": [3 * C],
           "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C], "ln_2.weight": [C], "ln_2.bias": [C],
           "mlp.c_fc.weight": [C, 4 * C], "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [4 * C, C],
           "mlp.c_proj.bias": [C]}
    for i in range(L):
        for k in BLOCK_PARAMS:
            s[f"h.{i}.{k}"] = per[k]
    s["ln_f.weight"] = [C]
    s["ln_f.bias"] = [C]
    return s


def gpt2_init(V, P, L, H, C, seed):
    """backend/model/state.cpp's scheme with torch's generator (the file, not the draws, is what both share)."""
    import torch
    if C % H:
        raise InputError(f"--n-embd {C} is not a multiple of --n-head {H}")
    gen = torch.Generator().manual_seed(seed)
    proj_std = 0.02 / math.sqrt(2 * max(1, L))
    out = {}
    for name, shape in hf_shapes(V, P, L, C).items():
        if ".ln_" in "." + name and name.endswith(".weight"):
            out[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        else:
            std = proj_std if name.endswith("c_proj.weight") else 0.02
            out[name] = torch.randn(shape, generator=gen) * std
    return out


def build_model(weights, n_head, ln_eps, attention):
    import torch
    import torch.nn.functional as F
    from torch import nn

    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in weights.items()}
    for k in [k for k in w if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias") or k == "lm_head.weight"]:
        if k == "lm_head.weight" and not torch.equal(w[k], w.get("wte.weight", w[k])):
            raise InputError("lm_head.weight differs from wte.weight: only a tied LM head is GPT-2 (and harmony-run)")
        del w[k]
    if "wte.weight" not in w or "wpe.weight" not in w:
        raise InputError("the weights have no wte.weight / wpe.weight: not a GPT-2 safetensors file")
    V, C = w["wte.weight"].shape
    P = w["wpe.weight"].shape[0]
    L = sum(1 for k in w if k.endswith(".ln_1.weight"))
    want = hf_shapes(V, P, L, C)
    if set(w) != set(want):
        extra, missing = sorted(set(w) - set(want)), sorted(set(want) - set(w))
        raise InputError(f"the weights are not GPT-2's: unexpected {extra[:4]}, missing {missing[:4]}")
    for k, shape in want.items():
        if list(w[k].shape) != shape:
            raise InputError(f"{k} has shape {list(w[k].shape)}, GPT-2 of C = {C} wants {shape}")
    if n_head <= 0 or C % n_head:
        raise InputError(f"n_head {n_head} does not divide n_embd {C}: give --n-head")
    H, hs = n_head, C // n_head

    def conv1d(x, weight, bias):  # transformers' Conv1D: x @ W + b with W [in, out]
        return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], weight.shape[1])

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.p = nn.ParameterList([nn.Parameter(w[f"h.{i}.{k}"]) for k in BLOCK_PARAMS])

        def forward(self, x, mask):
            ln1w, ln1b, aw, ab, pw, pb, ln2w, ln2b, fw, fb, mw, mb = self.p
            Bn, Tn, _ = x.shape
            qkv = conv1d(F.layer_norm(x, (C,), ln1w, ln1b, ln_eps), aw, ab)
            q, k, v = (t.view(Bn, Tn, H, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
            if mask is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # the oracle's math (scripts/make_gpt2_oracle.py)
                a = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs)
                a = a.masked_fill(~mask, torch.finfo(a.dtype).min)
                y = torch.matmul(torch.softmax(a, dim=-1), v)
            x = x + conv1d(y.transpose(1, 2).contiguous().view(Bn, Tn, C), pw, pb)
            m = F.gelu(conv1d(F.layer_norm(x, (C,), ln2w, ln2b, ln_eps), fw, fb), approximate="tanh")
            return x + conv1d(m, mw, mb)

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Parameter(w["wte.weight"])
            self.wpe = nn.Parameter(w["wpe.weight"])
            self.h = nn.ModuleList([Block(i) for i in range(L)])
            self.ln_f_w = nn.Parameter(w["ln_f.weight"])
            self.ln_f_b = nn.Parameter(w["ln_f.bias"])

        def forward(self, idx, targets):
            Tn = idx.shape[1]
            mask = None
            if attention == "manual":
                mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool, device=idx.device)).view(1, 1, Tn, Tn)
            x = self.wte[idx] + self.wpe[:Tn]
            for blk in self.h:
                x = blk(x, mask)
            x = F.layer_norm(x, (C,), self.ln_f_w, self.ln_f_b, ln_eps)
            logits = torch.matmul(x, self.wte.t())  # the LM head tied to wte, no bias
            return F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))

    cfg = {"vocab_size": V, "n_positions": P, "n_layer": L, "n_head": H, "n_embd": C}
    return GPT2(), cfg


def is_oom(e):
    import torch
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(e, oom):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def model_flops_per_step(n_params, L, C, T, B):
    """PaLM's count, as scripts/gpu_verdict.py: 6 N per token plus 12 L C T per token for attention."""
    return (6 * n_params + 12 * L * C * T) * B * T


def sync(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


# --- commands ------------------------------------------------------------------------------------------------------
def cmd_init(a):
    import torch
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    w = gpt2_init(a.vocab_size, a.n_positions, a.n_layer, a.n_head, a.n_embd, a.seed)
    write_safetensors(a.out, w, {"format": "pt", "n_head": str(a.n_head),
                                 "source": f"scripts/torch_side_by_side.py init --seed {a.seed}"})
    n = sum(t.numel() for t in w.values())
    print(json.dumps({"out": a.out, "num_parameters": n, "bytes": os.path.getsize(a.out)}))
    return 0


def cmd_tokens(a):
    write_tokens(a.out, synthetic_tokens(a.vocab_size, a.count, a.seed))
    print(json.dumps({"out": a.out, "tokens": a.count, "name":
                      f"synthetic:markov{SYNTHETIC_SUCCESSORS}:V={a.vocab_size}:n={a.count}:seed={a.seed}"}))
    return 0


def pick_device(want):
    import torch
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    return want


def cmd_train(a):
    # What can be checked without torch first (it takes seconds to load).
    U = a.microbatch or a.batch
    if a.batch < 1 or U < 1 or a.batch % U:
        raise InputError(f"--microbatch {U} must divide --batch {a.batch}")
    if a.memory_cap is not None and a.device == "cpu":
        raise InputError("--memory-cap caps the CUDA caching allocator (set_per_process_memory_fraction): "
                         "it needs --device cuda")
    tokens = read_tokens(a.data)
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
    device = pick_device(a.device)
    fallbacks = []
    if a.memory_cap is not None and device != "cuda":
        raise InputError("--memory-cap caps the CUDA caching allocator (set_per_process_memory_fraction): "
                         "it needs --device cuda")
    # Attention: SDPA where torch has it (2.0+), else the oracle's explicit masked softmax.
    has_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    attention = a.attention
    if attention == "auto":
        attention = "sdpa" if has_sdpa else "manual"
        if not has_sdpa:
            fallbacks.append(f"torch {torch.__version__} has no F.scaled_dot_product_attention: explicit masked "
                             "softmax attention")
    elif attention == "sdpa" and not has_sdpa:
        raise InputError(f"--attention sdpa: torch {torch.__version__} has no F.scaled_dot_product_attention")
    if a.compile and not hasattr(torch, "compile"):
        raise InputError(f"--compile: torch {torch.__version__} has no torch.compile")
    if a.dtype == "bf16" and device == "cpu":
        fallbacks.append("bf16 autocast on the CPU (slow; for CI, not for timing)")

    weights, meta = read_safetensors(a.weights)
    n_head = a.n_head or int(meta.get("n_head", 0) or 0)
    if n_head <= 0:
        cj = os.path.join(os.path.dirname(os.path.abspath(a.weights)), "config.json")
        if os.path.exists(cj):
            n_head = int(json.load(open(cj)).get("n_head", 0))
    if n_head <= 0:
        raise InputError(f"{a.weights}: no n_head in its metadata or a config.json beside it: give --n-head")
    model, cfg = build_model(weights, n_head, a.ln_eps, attention)
    del weights
    if max(tokens) >= cfg["vocab_size"]:
        raise InputError(f"{a.data}: token id {max(tokens)} >= the model's vocab_size {cfg['vocab_size']}")
    if a.seq_len > cfg["n_positions"]:
        raise InputError(f"--seq-len {a.seq_len} > the model's {cfg['n_positions']} positions")
    n_params = sum(p.numel() for p in model.parameters())

    result = {
        "schema_version": 1, "command": "torch_side_by_side train", "torch_version": torch.__version__,
        "python_version": platform.python_version(), "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "dtype": a.dtype,
        "settings": {"weights": a.weights, "data": a.data, "seq_len": a.seq_len, "batch": a.batch, "microbatch": U,
                     "steps": a.steps, "lr": a.lr, "beta1": a.beta1, "beta2": a.beta2, "eps": a.eps,
                     "weight_decay": a.weight_decay, "ln_eps": a.ln_eps, "attention": attention, "adamw": None,
                     "compile": a.compile, "compile_budget_s": a.compile_budget_s,
                     "memory_cap_bytes": a.memory_cap, "memory_fraction": None,
                     "threads": torch.get_num_threads()},
        "fallbacks": fallbacks, "model": dict(cfg, num_parameters=n_params),
        "trains": None, "oom": None, "steps": [], "summary": None,
    }
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        if a.memory_cap is not None:
            total = torch.cuda.get_device_properties(0).total_memory
            frac = min(1.0, a.memory_cap / total)
            torch.cuda.set_per_process_memory_fraction(frac)
            result["settings"]["memory_fraction"] = frac
        if a.dtype == "fp32":  # strict fp32, as harmony-run without --tf32
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

    def oom(where, step, e):
        result["trains"] = False
        result["oom"] = {"where": where, "step": step, "message": str(e).strip().splitlines()[0][:400]}

    step_no = 0
    try:
        model = model.to(device)
        params = list(model.parameters())
        # AdamW: fused on CUDA where torch has it (2.0+), else foreach, else the per-tensor loop (torch 1.13 CPU).
        kinds = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
        order = [a.adamw] if a.adamw != "auto" else (["fused", "foreach"] if device == "cuda" else ["for-loop"])
        opt, used = None, None
        for kind in order:
            try:
                opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                                        weight_decay=a.weight_decay, **kinds[kind])
                used = kind
                break
            except (TypeError, RuntimeError, ValueError) as e:
                if a.adamw != "auto":
                    raise InputError(f"--adamw {kind}: torch {torch.__version__} refuses it: {e}")
                fallbacks.append(f"no {kind} AdamW on {device} in torch {torch.__version__} ({str(e)[:80]})")
        if device == "cpu" and a.adamw == "auto":
            fallbacks.append("AdamW as a per-tensor loop on the CPU (no fused kernel)")
        result["settings"]["adamw"] = used
        step_fn = model
        if a.compile:
            step_fn = torch.compile(model)
        bf16 = a.dtype == "bf16"
        B, T = a.batch, a.seq_len
        for step in range(a.steps):
            step_no = step + 1
            if a.simulate_oom_at_step == step_no:
                oom_type = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
                raise oom_type(f"CUDA out of memory (simulated at step {step_no} by --simulate-oom-at-step)")
            inp, tgt = batch(tokens, step, B, T)
            inp = torch.tensor(inp, dtype=torch.long).view(B, T).to(device)
            tgt = torch.tensor(tgt, dtype=torch.long).view(B, T).to(device)
            sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            total = None
            for m in range(0, B, U):
                with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
                    loss = step_fn(inp[m:m + U], tgt[m:m + U])
                (loss * (U / B)).backward()  # the minibatch's mean gradient, as harmony's microbatches sum it
                d = loss.detach() * (U / B)
                total = d if total is None else total + d
            opt.step()
            value = float(total.item())
            sync(device)
            dt = time.perf_counter() - t0
            result["steps"].append({"step": step_no, "loss": value, "step_time_s": dt,
                                    "throughput_samples_per_s": B / dt})
            if not math.isfinite(value):
                break
        result["trains"] = True
    except Exception as e:  # an out-of-memory is a result; anything else is a crash
        if not is_oom(e):
            raise
        oom("setup" if step_no == 0 else "step", step_no or None, e)

    steps = result["steps"]
    times = [s["step_time_s"] for s in steps]
    timed = times[1:] or times
    mean = sum(timed) / len(timed) if timed else None
    flops = model_flops_per_step(n_params, cfg["n_layer"], cfg["n_embd"], a.seq_len, a.batch)
    result["summary"] = {
        "losses": [s["loss"] for s in steps],
        "steps_run": len(steps),
        "first_step_time_s": times[0] if times else None,  # with torch.compile: the compile
        "step_time_s": mean,  # mean over the steps after the first (warm-up), the first alone when it is the only
        "throughput_samples_per_s": a.batch / mean if mean else None,
        "tokens_per_s": a.batch * a.seq_len / mean if mean else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved() if device == "cuda" else None,
        "num_parameters": n_params,
        "model_flops_per_step": flops,
        "mfu": flops / mean / (a.peak_tflops * 1e12) if mean and a.peak_tflops else None,
        "compile_within_budget": (None if not a.compile or not times else
                                  (a.compile_budget_s is None or times[0] <= a.compile_budget_s)),
    }
    print(json.dumps(result, indent=1))
    return 0


def main(argv):
    p = argparse.ArgumentParser(prog="torch_side_by_side.py", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init", help="write GPT-2's initialisation as safetensors")
    for k in ["vocab-size", "n-positions", "n-layer", "n-head", "n-embd"]:
        i.add_argument("--" + k, type=int, required=True)
    i.add_argument("--seed", type=int, default=1)
    i.add_argument("--out", required=True)
    t = sub.add_parser("tokens", help="write harmony-run's synthetic task as an llm.c token file")
    t.add_argument("--vocab-size", type=int, required=True)
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--out", required=True)
    r = sub.add_parser("train", help="train and print one JSON document")
    r.add_argument("--weights", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--seq-len", type=int, required=True)
    r.add_argument("--batch", type=int, required=True)
    r.add_argument("--microbatch", type=int, default=0, help="gradient accumulation in microbatches of this size")
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--lr", type=float, default=1e-3)  # harmony-run's defaults (docs/config.md, train.*)
    r.add_argument("--beta1", type=float, default=0.9)
    r.add_argument("--beta2", type=float, default=0.999)
    r.add_argument("--eps", type=float, default=1e-8)
    r.add_argument("--weight-decay", type=float, default=0.0)
    r.add_argument("--ln-eps", type=float, default=1e-5)
    r.add_argument("--n-head", type=int, default=0)
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    r.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    r.add_argument("--attention", choices=["auto", "sdpa", "manual"], default="auto")
    r.add_argument("--adamw", choices=["auto", "fused", "foreach", "for-loop"], default="auto")
    r.add_argument("--compile", action="store_true")
    r.add_argument("--compile-budget-s", type=float, default=None)
    r.add_argument("--memory-cap", type=int, default=None, help="bytes the CUDA caching allocator may hold")
    r.add_argument("--threads", type=int, default=0)
    r.add_argument("--peak-tflops", type=float, default=None)
    r.add_argument("--simulate-oom-at-step", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv[1:])
    if a.cmd == "train" and (a.steps < 1 or a.seq_len < 1):
        p.error("--steps and --seq-len must be >= 1")
    try:
        return {"init": cmd_init, "tokens": cmd_tokens, "train": cmd_train}[a.cmd](a)
    except InputError as e:
        print(f"torch_side_by_side: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"torch_side_by_side: error: {e} (Debian: apt-get install python3-torch)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
