#!/usr/bin/env python3
"""scripts/torch_side_by_side.py, the PyTorch run gpu-check.sh puts beside harmony-run (issue 34), against
harmony-run's CPU device on a tiny GPT-2, so that on the GPU it cannot differ for a trivial reason (another
initialisation, token order, AdamW setting or model detail): the script writes the initialisation and the token
file, both tools train from them, and the losses must agree. Also: its token file is harmony-run's synthetic task
token for token; its JSON names its fallbacks on torch 1.13 (no SDPA, no fused AdamW); an out-of-memory is a
result (exit 0, "trains": false), not a crash; bad input is exit 2 with the reason.

Tolerance, fp32 (LOSS_RTOL = 1e-6 relative, per step): both sides compute in fp32 and differ only in summation
order (torch's blocked BLAS and vectorised reductions against backend/'s fixed loops), a few ulps per operation;
with AdamW eps 1e-5 (the committed oracle's: rounding noise in near-zero gradients is not amplified by lr/eps),
the same bound tests/backend/test_oracle.cpp holds harmony-run to against the committed PyTorch oracle (~10 ulps of a
loss of 4.8). Measured here: 9e-8 over 8 steps (torch 1.13, GCC 12, x86-64): a 10x margin. A wrong lr, beta,
eps, weight decay, data offset, microbatch scaling, GELU or init is off by >= 1e-4 by step 2.
bf16 (harmony-run's bf16 weights/activations against torch's bf16 autocast): gpu_verdict.py's loss-curve bound
(2% relative per step), which the GPU row applies; measured here ~5e-5.

Needs torch: the first of sys.executable, $TORCH_PYTHON, /usr/bin/python3 that imports it (Debian's python3-torch,
scripts/install-deps.sh); exit 77 (SKIP) when none does.
The harmony-run side is plan.mode=resident on one device (weights, gradients and AdamW state on the device, updated
there: the in-memory trainer the GPU row compares with PyTorch)."""
import json
import os
import subprocess
import sys
import tempfile

from clitest import ROOT, check, failures, summary

RUN = sys.argv[1]
SCRIPT = os.path.join(ROOT, "scripts/torch_side_by_side.py")
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_verdict  # noqa: E402  (LOSS_CURVE_RTOL: the GPU row's bound)

LOSS_RTOL = 1e-6
V, P, L, H, C = 128, 32, 2, 2, 32
B, U, T, STEPS = 4, 2, 16, 8
ADAMW = {"lr": "3e-3", "beta1": "0.9", "beta2": "0.95", "eps": "1e-5", "weight_decay": "0.1"}
PLAN = f"{{mode: resident, gpus: 1, minibatch: {B}, u_fwd: {U}, u_bwd: {U}}}"


def torch_python():
    """The first interpreter that has torch (found, not imported: importing takes seconds)."""
    cands = [sys.executable, os.environ.get("TORCH_PYTHON", ""), "/usr/bin/python3"]
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    for p in cands:
        if p and os.path.exists(p) and subprocess.run([p, "-c", probe], capture_output=True).returncode == 0:
            return p
    return None


def script(py, *args):
    return subprocess.run([py, SCRIPT, *args], capture_output=True, text=True, timeout=300)


def harmony(tmp, name, weights, data, *extra):
    cfg = os.path.join(tmp, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(f"""model: {{weights: {weights}, seq_len: {T}}}
machine: {{preset: cpu-4x, gpu_memory: 64MiB}}
device: cpu
plan: {PLAN}
train: {{steps: {STEPS}, lr: {ADAMW['lr']}, beta1: {ADAMW['beta1']}, beta2: {ADAMW['beta2']}, eps: {ADAMW['eps']},
        weight_decay: {ADAMW['weight_decay']}, data: {data}}}
""")
    r = subprocess.run([RUN, "train", cfg, "--format", "json", "--quiet", *extra], capture_output=True, text=True,
                       timeout=300)
    return r, (json.loads(r.stdout) if r.returncode == 0 else None)


def worst_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")


def main():
    py = torch_python()
    if py is None:
        print("SKIP: no python3 with torch (apt-get install python3-torch; or set TORCH_PYTHON)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        init, tokens = os.path.join(tmp, "init.safetensors"), os.path.join(tmp, "tokens.bin")
        r = script(py, "init", "--vocab-size", str(V), "--n-positions", str(P), "--n-layer", str(L), "--n-head", str(H),
                   "--n-embd", str(C), "--seed", "3", "--out", init)
        check("init: exit 0", r.returncode == 0, r.stderr)
        r = script(py, "tokens", "--vocab-size", str(V), "--count", "4096", "--seed", "5", "--out", tokens)
        check("tokens: exit 0", r.returncode == 0, r.stderr)
        if failures:
            return summary()

        # --- the token file is harmony-run's synthetic task, token for token: the same losses bit for bit
        rf, hf = harmony(tmp, "file", init, tokens)
        rs, hs = harmony(tmp, "synthetic", init, "{synthetic_tokens: 4096, seed: 5}")
        check("harmony-run trains from the script's init and tokens", hf is not None, rf.stderr)
        check("harmony-run trains on its synthetic task", hs is not None, rs.stderr)
        if hf and hs:
            check("tokens = harmony-run's synthetic task (losses bit for bit)",
                  hf["summary"]["losses"] == hs["summary"]["losses"], (hf["summary"]["losses"], hs["summary"]["losses"]))

        # --- fp32: the same GPT-2, init, tokens, order, microbatches and AdamW -> the same losses
        common = ["--weights", init, "--data", tokens, "--seq-len", str(T), "--batch", str(B), "--microbatch", str(U),
                  "--steps", str(STEPS), "--lr", ADAMW["lr"], "--beta1", ADAMW["beta1"], "--beta2", ADAMW["beta2"],
                  "--eps", ADAMW["eps"], "--weight-decay", ADAMW["weight_decay"], "--threads", "1", "--device", "cpu"]
        r = script(py, "train", *common)
        t = json.loads(r.stdout) if r.returncode == 0 else None
        check("train fp32: exit 0, JSON", t is not None, r.stderr)
        if t and hf:
            lt, lh = t["summary"]["losses"], hf["summary"]["losses"]
            w = worst_rel(lt, lh)
            check(f"fp32 losses within {LOSS_RTOL:g} of harmony-run's CPU device over {STEPS} steps",
                  len(lt) == STEPS and w <= LOSS_RTOL, f"worst {w:.2e}: torch {lt}, harmony {lh}")
            check("the losses move (the comparison is not of a model that does not train)",
                  abs(lh[0] - lh[-1]) > 50 * LOSS_RTOL * lh[0], lh)
            print(f"fp32: worst relative loss difference {w:.2e} over {STEPS} steps")
            check("trains: true, no oom", t["trains"] is True and t["oom"] is None, t)
            check("one step record per step, times positive",
                  [s["step"] for s in t["steps"]] == list(range(1, STEPS + 1))
                  and all(s["step_time_s"] > 0 for s in t["steps"]), t["steps"])
            s = t["summary"]
            check("summary: parameters, FLOPs, mean step time after the first",
                  s["num_parameters"] == hf["summary"]["num_parameters"]
                  and s["model_flops_per_step"] == gpu_verdict.model_flops_per_step(
                      s["num_parameters"], {"n_layer": L, "n_embd": C}, T, B)
                  and abs(s["step_time_s"] - sum(x["step_time_s"] for x in t["steps"][1:]) / (STEPS - 1)) < 1e-12, s)
            check("CPU: peak memory null (CUDA allocator only)", s["peak_memory_bytes"] is None, s)
            check("settings recorded", t["settings"]["microbatch"] == U and t["settings"]["lr"] == 3e-3
                  and t["device"] == "cpu" and t["dtype"] == "fp32", t["settings"])
            # without SDPA (Debian's torch 1.13) the explicit attention, and the fallback named; with it, SDPA
            sdpa_named = any("scaled_dot_product_attention" in f for f in t["fallbacks"])
            check("attention: SDPA where torch has it, else the fallback named",
                  (t["settings"]["attention"] == "manual") == sdpa_named
                  and (t["torch_version"].startswith("1.") <= sdpa_named), (t["torch_version"], t["fallbacks"]))
            check("CPU: AdamW fallback named", t["settings"]["adamw"] == "for-loop"
                  and any("AdamW" in f for f in t["fallbacks"]), t["fallbacks"])

        # --- bf16: harmony-run's bf16 against torch's autocast, within the GPU row's loss-curve bound
        rb, hb = harmony(tmp, "bf16", init, tokens, "--dtype", "bf16")
        r = script(py, "train", *common, "--dtype", "bf16")
        tb = json.loads(r.stdout) if r.returncode == 0 else None
        check("bf16: both train", hb is not None and tb is not None, rb.stderr + r.stderr)
        if hb and tb:
            w = worst_rel(tb["summary"]["losses"], hb["summary"]["losses"])
            check(f"bf16 losses within the verdict's {gpu_verdict.LOSS_CURVE_RTOL:.0%}", w <= gpu_verdict.LOSS_CURVE_RTOL,
                  (tb["summary"]["losses"], hb["summary"]["losses"]))
            print(f"bf16: worst relative loss difference {w:.2e}")

        # --- an out-of-memory is a result: exit 0, trains false, the steps before it kept
        r = script(py, "train", *common, "--simulate-oom-at-step", "3")
        o = json.loads(r.stdout) if r.returncode == 0 else None
        check("OOM: exit 0 with JSON", o is not None, r.stderr)
        if o:
            check("OOM: trains false, where and step named", o["trains"] is False and o["oom"]["step"] == 3
                  and o["oom"]["where"] == "step" and "out of memory" in o["oom"]["message"], o["oom"])
            check("OOM: the two steps before it kept", len(o["steps"]) == 2, o["steps"])

        # --- bad input: exit 2 with the reason
        r = script(py, "train", *common, "--memory-cap", "1000000")
        check("--memory-cap on the CPU: exit 2, says it needs CUDA", r.returncode == 2 and "--device cuda" in r.stderr,
              r.stderr)
        r = script(py, "train", *common[:8], "--microbatch", "3", "--steps", "1", "--device", "cpu")
        check("microbatch not dividing the batch: exit 2", r.returncode == 2 and "must divide" in r.stderr, r.stderr)
        r = script(py, "train", *[x if x != init else tokens for x in common])
        check("tokens as weights: exit 2 naming the file", r.returncode == 2 and tokens in r.stderr, r.stderr)
        r = script(py, "train", *[x if x != tokens else os.path.join(tmp, "missing.bin") for x in common])
        check("missing token file: exit 2", r.returncode == 2 and "missing.bin" in r.stderr, r.stderr)
        r = script(py, "tokens", "--vocab-size", "70000", "--count", "10", "--out", os.path.join(tmp, "x.bin"))
        check("vocab beyond uint16: exit 2", r.returncode == 2 and "65536" in r.stderr, r.stderr)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
