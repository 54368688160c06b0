#!/usr/bin/env python3
"""harmony-run with Hugging Face weights as the Hub ships them, end to end: scripts/make-hub-fixture.py writes a
tiny GPT-2 folder (model.safetensors with {"format": "pt"} only + config.json) and harmony-run loads it through
model.weights as a folder or a file, F32/F16/BF16, with and without the transformer. prefix and lm_head, to the
expected fp32 values (a step at lr 0 then --save-weights); config.json mismatches, a folder without weights and
missing n_head are exit 2 naming the file; model.n_head overrides; a training run from the folder works."""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

from clitest import ROOT, check, finish, runner

RUN = sys.argv[1]
FIXTURE = os.path.join(ROOT, "scripts/make-hub-fixture.py")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(ROOT, "scripts"))
hub = __import__("make-hub-fixture")  # expected_value, param_shapes, CONFIG


def fixture(out, *args):
    subprocess.run([sys.executable, FIXTURE, out, *args], check=True)
    return out


def config(tmp, name, weights, extra_model="", steps=1, lr="0"):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(f"""model:
  weights: {weights}
  seq_len: 16
{extra_model}machine:
  file: {os.path.abspath(os.path.join(ROOT, "configs/machines/cpu-4x.yaml"))}
  gpu_memory: 8MiB
device: cpu
plan: {{mode: harmony-pp, gpus: 4, minibatch: 4, u_fwd: 2, u_bwd: 2, pack_size: 1}}
train: {{steps: {steps}, lr: {lr}, weight_decay: 0.0, data: {{synthetic_tokens: 4096, seed: 1}}}}
""")
    return path


run = runner(RUN, timeout=600)


def read_f32_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t
        b, e = t["data_offsets"]
        raw = data[8 + n + b:8 + n + e]
        out[name] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return out


def expected():
    return {name: [hub.expected_value(name, j) for j in range(hub.numel(shape))]
            for name, shape in hub.param_shapes(hub.CONFIG)}


def json_line_of(path, key):
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if f'"{key}"' in line:
                return i
    return 0


with tempfile.TemporaryDirectory() as tmp:
    want = expected()
    # --- every dtype, with and without the transformer. prefix (and lm_head): the expected fp32 values
    losses = {}
    for dtype in ("F32", "F16", "BF16"):
        for variant, args in (("plain", []), ("prefix", ["--prefix", "--lm-head"])):
            tag = f"{dtype}-{variant}"
            folder = fixture(os.path.join(tmp, tag), "--dtype", dtype, *args)
            cfg = config(tmp, tag + ".yaml", folder)
            saved = os.path.join(tmp, tag + ".out.safetensors")
            r = run("train", cfg, "--quiet", "--format", "json", "--save-weights", saved)
            check(f"{tag}: loads and trains a step (exit 0)", r.returncode == 0, r.stderr)
            if r.returncode != 0:
                continue
            losses[tag] = json.loads(r.stdout)["summary"]["losses"]
            got = read_f32_safetensors(saved)
            check(f"{tag}: the same tensors", sorted(got) == sorted(want), sorted(got))
            bad = [n for n in want if got.get(n) != want[n]]
            check(f"{tag}: every weight is the fixture's value (lr 0 keeps them)", not bad, bad[:5])
    check("all six variants give the same loss bit for bit", len(set(json.dumps(v) for v in losses.values())) == 1,
          losses)

    # --- model.weights naming the file: config.json beside it is read too
    base = os.path.join(tmp, "F32-plain")
    r = run("train", config(tmp, "file.yaml", os.path.join(base, "model.safetensors")), "--steps", "1")
    check("model.weights = the file (config.json beside it): exit 0", r.returncode == 0, r.stderr)
    check("the model line shows the config.json's shape", "gpt2 L2 C16 H2 V96 T16" in r.stdout, r.stdout)

    # --- a training run from the folder: the loss is finite and falls over 20 steps at lr 3e-3
    r = run("train", config(tmp, "train.yaml", base, steps=20, lr="3e-3"), "--quiet", "--format", "json")
    check("training from a Hub folder: exit 0", r.returncode == 0, r.stderr)
    if r.returncode == 0:
        s = json.loads(r.stdout)["summary"]
        check("training from a Hub folder: the loss falls", s["final_loss"] < s["first_loss"], s)

    # --- the README's example config, pointed at the fixture folder
    r = run("train", os.path.join(ROOT, "configs/run/hub-gpt2.yaml"), "--set", f"model.weights={base}", "--steps", "2")
    check("configs/run/hub-gpt2.yaml trains from a Hub folder: exit 0", r.returncode == 0, r.stderr)

    # --- config.json checked against the tensors: a located error, exit 2
    for key, value, says in (("n_layer", 3, "blocks h.0 .. h.1"), ("n_embd", 32, "wte.weight is [96, 16]"),
                             ("vocab_size", 50257, "wte.weight is [96, 16]"),
                             ("n_positions", 1024, "wpe.weight is [32, 16]")):
        folder = fixture(os.path.join(tmp, "bad-" + key), "--config-set", f"{key}={value}")
        r = run("train", config(tmp, f"bad-{key}.yaml", folder), "--steps", "1")
        cj = os.path.join(folder, "config.json")
        line = json_line_of(cj, key)
        check(f"config.json {key} mismatch: exit 2", r.returncode == 2, (r.returncode, r.stderr))
        check(f"config.json {key} mismatch: located, names the tensors", re.search(
            rf"{re.escape(cj)}:{line}:\d+: {key} = {value}, but .*model\.safetensors has .*{re.escape(says)}",
            r.stderr) is not None, r.stderr)
    folder = fixture(os.path.join(tmp, "bad-heads"), "--config-set", "n_head=3")
    r = run("train", config(tmp, "bad-heads.yaml", folder), "--steps", "1")
    check("config.json n_head not dividing n_embd: exit 2 naming config.json", r.returncode == 2 and
          f"{os.path.join(folder, 'config.json')}:{json_line_of(os.path.join(folder, 'config.json'), 'n_head')}:" in
          r.stderr, r.stderr)
    # a model_type harmony-run does not train is refused; llama, mistral and qwen2 are trained
    # (tests/cli/test_run_llama.py), so a GPT-2 folder labelled llama or qwen2 is refused for the Llama keys its
    # config.json lacks, naming the file
    for model_type, want in (("mixtral", "model_type is \"mixtral\""), ("llama", "max_position_embeddings"),
                             ("qwen2", "max_position_embeddings")):
        folder = fixture(os.path.join(tmp, model_type))
        with open(os.path.join(folder, "config.json")) as f:
            conf = json.load(f)
        conf["model_type"] = model_type
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)
        r = run("train", config(tmp, model_type + ".yaml", folder), "--steps", "1")
        check(f"config.json model_type {model_type} over GPT-2 tensors: exit 2",
              r.returncode == 2 and want in r.stderr and "config.json" in r.stderr, r.stderr)

    # --- no config.json: the Hub's file alone has no n_head; model.n_head gives it and overrides config.json
    folder = fixture(os.path.join(tmp, "noconf"), "--no-config")
    r = run("train", config(tmp, "noconf.yaml", folder), "--steps", "1")
    check("no config.json, no n_head: exit 2 with the fix", r.returncode == 2 and "config.json" in r.stderr and
          "model.n_head" in r.stderr, r.stderr)
    r = run("train", config(tmp, "noconf-h.yaml", folder, "  n_head: 2\n"), "--steps", "1")
    check("no config.json, model.n_head: 2: exit 0", r.returncode == 0 and "H2" in r.stdout, r.stderr)
    r = run("train", config(tmp, "override.yaml", base, "  n_head: 4\n"), "--steps", "1")
    check("model.n_head: 4 overrides config.json's 2", r.returncode == 0 and "gpt2 L2 C16 H4" in r.stdout,
          r.stdout + r.stderr)
    r = run("train", os.path.join(ROOT, "configs/run/default.yaml"), "--steps", "1", "--set", "model.n_head=4")
    check("model.n_head without model.weights: exit 2", r.returncode == 2 and "model.n_head goes with" in r.stderr,
          r.stderr)

    # --- folders without model.safetensors
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    r = run("train", config(tmp, "empty.yaml", empty), "--steps", "1")
    check("a folder without model.safetensors: exit 2", r.returncode == 2 and "has no model.safetensors" in r.stderr,
          r.stderr)
    with open(os.path.join(empty, "pytorch_model.bin"), "wb") as f:
        f.write(b"PK")
    r = run("train", config(tmp, "empty.yaml", empty), "--steps", "1")
    check("a folder with only pytorch_model.bin: says to convert", r.returncode == 2 and "safe_serialization" in
          r.stderr, r.stderr)

finish()
