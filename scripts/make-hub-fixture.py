#!/usr/bin/env python3
# Writes a tiny GPT-2 in the Hugging Face Hub's exact folder layout, for the tests of model.weights: a
# model.safetensors as the safetensors library writes it (metadata {"format": "pt"} only, compact header
# padded with spaces to 8 bytes, tensors sorted by name, data in the same order) and the config.json that
# transformers writes beside it. Standard library only, so CI needs no torch. Usage:
#   scripts/make-hub-fixture.py OUT_DIR [--dtype F32|F16|BF16] [--prefix] [--lm-head] [--no-buffers]
#                                       [--config-set KEY=INT ...] [--no-config]
# Every weight is k/256 with k in [-127, 127] (expected_value below), exact in F32, F16 and BF16, so each
# variant loads to the same fp32 values.
import argparse
import array
import json
import os
import struct

CONFIG = dict(vocab_size=96, n_positions=32, n_layer=2, n_head=2, n_embd=16)


def param_shapes(cfg):
    """GPT-2's parameters under HF names (Conv1D weights [in, out]), in the model's order."""
    V, P, L, C = cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"], cfg["n_embd"]
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [P, C])]
    for i in range(L):
        h = f"h.{i}."
        shapes += [
            (h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]),
            (h + "attn.c_attn.weight", [C, 3 * C]), (h + "attn.c_attn.bias", [3 * C]),
            (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
            (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]),
            (h + "mlp.c_fc.weight", [C, 4 * C]), (h + "mlp.c_fc.bias", [4 * C]),
            (h + "mlp.c_proj.weight", [4 * C, C]), (h + "mlp.c_proj.bias", [C]),
        ]
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    return shapes


def expected_value(name, j):
    """Element j of parameter NAME (its HF name without prefix): k/256, k in [-127, 127]."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(name))
    return float(((j * 37 + seed * 11) % 255) - 127) / 256.0


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def encode(values, dtype):
    if dtype == "F32":
        return array.array("f", values).tobytes()
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    if dtype == "BF16":
        words = array.array("I", array.array("f", values).tobytes())
        out = array.array("H")
        for w in words:  # round to nearest even (what torch does); exact for these values
            out.append(((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF)
        return out.tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, metadata):
    """tensors: {name: (dtype, shape, bytes)}; sorted by name as safetensors does for one dtype."""
    header = {"__metadata__": metadata}
    offset = 0
    names = sorted(tensors)
    for name in names:
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            f.write(tensors[name][2])


def hf_config(cfg):
    """config.json as transformers writes it for GPT2LMHeadModel."""
    return {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": 50256,
        "embd_pdrop": 0.1,
        "eos_token_id": 50256,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_ctx": cfg["n_positions"],
        "n_embd": cfg["n_embd"],
        "n_head": cfg["n_head"],
        "n_inner": None,
        "n_layer": cfg["n_layer"],
        "n_positions": cfg["n_positions"],
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.1,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "summary_activation": None,
        "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "torch_dtype": "float32",
        "transformers_version": "4.40.0",
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"])
    ap.add_argument("--prefix", action="store_true", help="names under transformer. (GPT2LMHeadModel)")
    ap.add_argument("--lm-head", action="store_true", help="also write lm_head.weight (a copy of wte)")
    ap.add_argument("--no-buffers", action="store_true", help="leave out the h.N.attn.bias mask buffers")
    ap.add_argument("--config-set", action="append", default=[], help="KEY=INT written into config.json")
    ap.add_argument("--no-config", action="store_true", help="write no config.json")
    a = ap.parse_args()
    cfg = dict(CONFIG)
    os.makedirs(a.out, exist_ok=True)
    pre = "transformer." if a.prefix else ""
    tensors = {}
    for name, shape in param_shapes(cfg):
        values = [expected_value(name, j) for j in range(numel(shape))]
        tensors[pre + name] = (a.dtype, shape, encode(values, a.dtype))
        if name == "wte.weight" and a.lm_head:
            tensors["lm_head.weight"] = (a.dtype, shape, encode(values, a.dtype))
    if not a.no_buffers:
        P = cfg["n_positions"]
        mask = [1.0 if c <= r else 0.0 for r in range(P) for c in range(P)]
        for i in range(cfg["n_layer"]):
            tensors[f"{pre}h.{i}.attn.bias"] = (a.dtype, [1, 1, P, P], encode(mask, a.dtype))
            tensors[f"{pre}h.{i}.attn.masked_bias"] = (a.dtype, [], encode([-1e4], a.dtype))
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, {"format": "pt"})
    if not a.no_config:
        conf = hf_config(cfg)
        conf["torch_dtype"] = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[a.dtype]
        for kv in a.config_set:
            key, value = kv.split("=", 1)
            conf[key] = int(value)
        with open(os.path.join(a.out, "config.json"), "w") as f:
            json.dump(conf, f, indent=2, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
