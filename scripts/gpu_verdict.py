#!/usr/bin/env python3
# The verdict of scripts/gpu-check.sh: reads the outputs it recorded in OUT_DIR (env.json, steps.jsonl, the
# benches' and harmony-run's JSON) and prints one table, | check | verdict | detail |, with PASSED, FAILED or
# SKIPPED (only for a named missing feature) per row. Exit 0 only when no row FAILED. Tested on recorded outputs
# in CI (tests/cli/test_gpu_verdict.py, tests/data/gpu-check/); needs no GPU. Thresholds: docs/benchmarks.md.
# Every ratio compares two runs of the same check (issue 34): the resident run (plan.mode=resident, the in-memory
# reference) against PyTorch (scripts/torch_side_by_side.py) at the same B and T, Harmony under a quarter of the
# resident run's memory against the resident run at the same minibatch, PyTorch at Harmony's cap.
#
# usage: gpu_verdict.py OUT_DIR [--markdown FILE]
import json
import math
import os
import re
import sys

# Thresholds (issue 15).
COPY_FRACTION = 0.80  # harmony's pinned copies vs the measured ceiling (raw cudaMemcpyAsync, best size)
MFU_MIN = 0.35  # in-memory model FLOP/s vs the GPU's dense BF16 peak
MIN_PARAMS = 350e6  # ... for a GPT-2 of at least this many parameters
MFU_SEQ_LEN = 1024  # ... at T = 1024
CAPPED_FRACTION = 0.85  # Harmony under a quarter of the resident run's memory vs its throughput, same minibatch
CAPPED_MEMORY = 0.25  # ... Harmony's measured peak at most this fraction of the resident run's
CAPPED_MINIBATCH = (32, 64)  # ... at a minibatch in this range
CAPPED_UBATCH = 8  # ... in microbatches of this size
TORCH_FRACTION = 0.80  # resident throughput vs PyTorch's (the faster of eager and torch.compile), same B, T, bf16
LOSS_CURVE_RTOL = 0.02  # resident vs PyTorch losses, every step (bf16 both: harmony's bf16 storage vs autocast)
LOSS_CURVE_STEPS = 20  # ... over at least this many steps
STAGING_FRACTION = 0.50  # bf16 staging: bytes of WB (dWB) over their summed durations vs the pinned H2D (D2H) ceiling
SIM_ERROR = 0.10  # |harmony-sim - measured| / measured
LOSS_RTOL = 1e-4  # CUDA vs CPU device losses over 3 steps (fp32, strict: no TF32, row-order sums)
# ... in bf16 (the CPU device emulates bf16 storage, round to nearest even): the bound the CUDA device's own 3-step
# bf16 training test argues (tests/backend/test_cuda_device.cpp, "Training": >= 3.5x the measured spread)
LOSS_RTOL_BF16 = 2e-4
DEADLINE_S = 480  # the whole check, build included (a smaller DEADLINE_S recorded in params.json is used instead)
PLAN_KINDS = ["harmony-pp", "harmony-dp", "pp-swap", "dp-swap", "zero-infinity", "zero-offload", "l2l", "lohan"]
CONCURRENT_KIND = "harmony-pp"  # the one CUDA loss row on the concurrent executor (the others run serially)
TESTS = ["backend_device_conformance", "backend_cuda_device", "backend_adamw_parallel", "backend_cuda_index"]
# Dense BF16 tensor-core peaks (TFLOP/s, no sparsity) by GPU name; PEAK_BF16_TFLOPS overrides (params.json).
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0}


class Verdict:
    def __init__(self):
        self.rows = []

    def add(self, check, verdict, detail):
        assert verdict in ("PASSED", "FAILED", "SKIPPED")
        self.rows.append((check, verdict, detail.replace("|", "/").replace("\n", " ")))

    def failed(self):
        return any(v == "FAILED" for _, v, _ in self.rows)

    def table(self):
        lines = ["| check | verdict | detail |", "|---|---|---|"]
        lines += [f"| {c} | {v} | {d} |" for c, v, d in self.rows]
        return "\n".join(lines) + "\n"


def load_json(out, name):
    """The parsed file, or None when it is missing or not JSON."""
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_steps(out):
    """name -> {"rc", "s", "deadline"} of every command gpu-check.sh ran (steps.jsonl, one object a line)."""
    steps = {}
    try:
        with open(os.path.join(out, "steps.jsonl")) as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    steps[d["name"]] = d
    except (OSError, ValueError):
        pass
    return steps


def version_tuple(v):
    m = re.match(r"(\d+)\.(\d+)", str(v or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def first_error(name):
    """The first line of NAME.log that mentions an error (or its last line), for the detail column."""
    try:
        with open(os.path.join(OUT, f"{name}.log"), errors="replace") as f:
            lines = [x.strip() for x in f if x.strip()]
    except OSError:
        return ""
    hit = next((x for x in lines if "error" in x.lower()), lines[-1] if lines else "")
    return f": {hit[:160]}" if hit else ""


def last_line(name):
    """The last non-empty line of NAME.out (a step's own summary), or None."""
    try:
        with open(os.path.join(OUT, f"{name}.out"), errors="replace") as f:
            lines = [x.strip() for x in f if x.strip()]
    except OSError:
        return None
    return lines[-1][:200] if lines else None


def step_problem(steps, name):
    """None when step `name` ran and exited 0; otherwise why not, in words."""
    s = steps.get(name)
    if s is None:
        return "not run"
    if s.get("deadline"):
        return f"not run: the {DEADLINE} s deadline had passed" if s.get("rc") is None else \
            f"cut off by the {DEADLINE} s deadline after {s.get('s', 0):.0f} s"
    if s.get("rc") in (124, 137):
        return f"timed out after {s.get('s', 0):.0f} s"
    if s.get("rc") != 0:
        return f"exit {s.get('rc')} (log {name}.log){first_error(name)}"
    return None


def mean_step_s(run):
    """Mean step time without the first (warm-up) step."""
    t = [x["step_time_s"] for x in run["steps"]]
    t = t[1:] or t
    return sum(t) / len(t)


def check_env(v, env):
    if env is None:
        v.add("environment", "FAILED", "env.json missing: gpu-check.sh stopped before it looked")
        return False
    problems = []
    bundle = env.get("bundle")
    if not env.get("nvcc") and not bundle:
        problems.append("nvcc not found (PATH, /usr/local/cuda/bin)")
    if not env.get("gpu"):
        problems.append("nvidia-smi lists no GPU" + (f" ({env['nvidia_smi_error']})" if env.get("nvidia_smi_error") else ""))
    need, have = version_tuple(env.get("toolkit_cuda")), version_tuple(env.get("driver_cuda"))
    if need and have and have < need:
        problems.append(f"driver {env.get('driver')} supports CUDA up to {env.get('driver_cuda')}, the "
                        f"{'bundle was built with' if bundle else 'toolkit is'} CUDA {env.get('toolkit_cuda')}: "
                        "update the driver")
    elif env.get("gpu") and not (need and have):
        problems.append(f"cannot compare versions: toolkit {env.get('toolkit_cuda')}, driver CUDA {env.get('driver_cuda')}")
    missing = [k for k, p in sorted((env.get("libs") or {}).items()) if not p and k != "libnccl"]
    if missing:
        problems.append("libraries not found: " + ", ".join(missing))
    if problems:
        v.add("environment", "FAILED", "; ".join(problems))
        return False
    libs = env.get("libs") or {}
    built = f"bundle {bundle} (built with CUDA {env.get('toolkit_cuda')})" if bundle else \
        f"toolkit CUDA {env.get('toolkit_cuda')}, nvcc {env['nvcc']}"
    v.add("environment", "PASSED",
          f"{env['gpu']} (sm_{str(env.get('compute_cap', '')).replace('.', '')}), driver {env.get('driver')} "
          f"(CUDA {env.get('driver_cuda')}) >= {built}"
          + ("" if libs.get("libnccl") else "; NCCL not found (copies communicator)"))
    return True


def check_copies(v, bench):
    rows = [("H2D", "h2d"), ("D2H", "d2h")]
    for label, k in rows:
        ceiling, got = bench.get(f"{k}_ceiling_GBps"), bench.get(f"{k}_device_GBps")
        if not ceiling or got is None:
            v.add(f"pinned {label} copies", "FAILED", "bench_cuda.json lacks the ceiling or the device-path rate")
            continue
        frac = got / ceiling
        v.add(f"pinned {label} copies >= {COPY_FRACTION:.0%} of ceiling", "PASSED" if frac >= COPY_FRACTION else "FAILED",
              f"{got:.1f} GB/s through CudaDevice::copy vs {ceiling:.1f} GB/s raw cudaMemcpyAsync ceiling "
              f"({frac:.0%})")


def check_adamw(v, out):
    best = None
    try:
        with open(os.path.join(out, "bench_adamw.txt")) as f:
            for line in f:
                p = line.split()
                if p and p[0] == "ParallelAdamW" and len(p) >= 5:
                    # columns: variant, threads, time (ms), params GB/s, traffic GB/s (7x: 28 B per 4 B parameter)
                    if best is None or float(p[3]) > best[1]:
                        best = (int(p[1]), float(p[3]), float(p[4]))
    except (OSError, ValueError):
        best = None
    if best is None:
        v.add("host AdamW", "FAILED", "no ParallelAdamW rows in bench_adamw.txt")
    else:
        v.add("host AdamW (best thread count)", "PASSED",
              f"{best[1]:.1f} GB/s of fp32 parameters = {best[1] / 4:.2f} G params/s, {best[2]:.1f} GB/s of memory "
              f"traffic (28 B per parameter), {best[0]} threads")


def model_flops_per_step(params, gpt2, T, B):
    """PaLM's count: 6 N per token plus 12 L C T per token for the attention scores and values."""
    return (6 * params + 12 * gpt2["n_layer"] * gpt2["n_embd"] * T) * B * T


def bf16_peak(env, params):
    if params.get("peak_bf16_tflops"):
        return float(params["peak_bf16_tflops"]), "PEAK_BF16_TFLOPS"
    name = (env or {}).get("gpu") or ""
    for key, peak in BF16_PEAK_TFLOPS.items():
        if all(word in name for word in key.split()):
            return peak, f"{key} datasheet"
    return None, None


def check_training(v, out, steps, env, params):
    ok_b = step_problem(steps, "b_in_memory")
    b = load_json(out, "b.json") if ok_b is None else None
    # bf16: a named missing feature is still a FAILED row: the throughput target needs it.
    if not params.get("bf16_implemented"):
        p = step_problem(steps, "bf16_cuda") if "bf16_cuda" in steps else None
        v.add("bf16 mixed precision", "FAILED",
              f"a 2-step `--dtype bf16` run on the CUDA device failed: {p}; the MFU target below assumes bf16" if p
              else "not implemented: harmony-run trains in fp32 only (no --dtype bf16); the MFU target below assumes it")
    if b is None:
        v.add("in-memory training", "FAILED", ok_b or "b.json is not JSON")
        return None
    losses = [x["loss"] for x in b["steps"]]
    if not losses or not all(math.isfinite(x) for x in losses):
        v.add("in-memory training", "FAILED", f"losses not finite: {losses}")
        return None
    step_s = mean_step_s(b)
    B = b["plan"]["minibatch"]
    gpt2, T = params["gpt2"], params["seq_len"]
    n = b["summary"]["num_parameters"]
    flops = model_flops_per_step(n, gpt2, T, B)
    peak, source = bf16_peak(env, params)
    what = f"{n / 1e6:.0f}M params, B={B} T={T}, {B / step_s:.2f} samples/s, {step_s:.3f} s/step"
    if peak is None:
        v.add(f"in-memory MFU >= {MFU_MIN:.0%} of dense BF16 peak", "FAILED",
              f"{what}; unknown GPU '{(env or {}).get('gpu')}': set PEAK_BF16_TFLOPS")
        return step_s
    mfu = flops / step_s / (peak * 1e12)
    problems = []
    if n < MIN_PARAMS:
        problems.append(f"model has {n / 1e6:.0f}M < {MIN_PARAMS / 1e6:.0f}M parameters")
    if T != MFU_SEQ_LEN:
        problems.append(f"T = {T}, the target is at T = {MFU_SEQ_LEN}")
    if mfu < MFU_MIN:
        problems.append(f"MFU {mfu:.1%} < {MFU_MIN:.0%}")
    v.add(f"in-memory MFU >= {MFU_MIN:.0%} of dense BF16 peak", "FAILED" if problems else "PASSED",
          f"{what}; MFU {mfu:.1%} of {peak:.0f} TFLOP/s ({source})" + ("; " + "; ".join(problems) if problems else ""))
    return step_s


FUSED = "fused kernels: (b) no slower than --no-fuse, same losses"
FUSED_SLOWER_MAX = 1.05  # the fused run's step time at most 5% over the unfused one's (timing noise)
FUSED_LOSS_RTOL = 0.02   # the same training, rounded differently in bf16: within the loss curves' 2%


def check_fused(v, out, steps):
    """(b) with the fused kernels (harmony-run's default on CUDA) against (b) with --no-fuse (step b_unfused, fewer
    steps): the mean step times and the losses of the steps both ran (the warm-up step not timed). No row when the check did not
    run b_unfused (recorded before issue 34's fused kernels)."""
    if "b_unfused" not in steps:
        return
    b, pb = load_run(out, steps, "b_in_memory", "b.json")
    u, pu = load_run(out, steps, "b_unfused")
    if b is None or u is None:
        v.add(FUSED, "FAILED", f"(b): {pb}" if b is None else f"--no-fuse run: {pu}")
        return
    lb, lu = [x["loss"] for x in b["steps"]], [x["loss"] for x in u["steps"]]
    n = min(len(lb), len(lu))
    if n == 0 or not all(math.isfinite(x) for x in lb[:n] + lu[:n]):
        v.add(FUSED, "FAILED", f"no finite losses to compare: (b) {lb[:n]}, --no-fuse {lu[:n]}")
        return
    worst = max(abs(lb[i] - lu[i]) / max(abs(lu[i]), 1e-12) for i in range(n))
    # the same steps of both runs (the first n, without the warm-up step): later steps of the longer run are not
    # compared with earlier ones of the shorter
    fb, fu = mean_step_s({"steps": b["steps"][:n]}), mean_step_s({"steps": u["steps"][:n]})
    problems = []
    if worst > FUSED_LOSS_RTOL:
        problems.append(f"losses differ by {worst:.2%} > {FUSED_LOSS_RTOL:.0%}")
    if fb > fu * FUSED_SLOWER_MAX:
        problems.append(f"fused is {fb / fu - 1:.1%} slower than unfused")
    v.add(FUSED, "FAILED" if problems else "PASSED",
          f"fused {fb:.3f} s/step, --no-fuse {fu:.3f} s/step ({fu / fb:.2f}x); losses within {worst:.2%} over {n} "
          "steps" + ("; " + "; ".join(problems) if problems else ""))


def load_run(out, steps, name, file=None):
    """(the run's JSON, None) when step `name` exited 0 and wrote `file` (NAME.json); else (None, why not)."""
    file = file or f"{name}.json"
    p = step_problem(steps, name)
    if p is not None:
        return None, p
    d = load_json(out, file)
    return (d, None) if d is not None else (None, f"{file} is not JSON")


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def check_capped(v, out, steps):
    """Harmony (--plan auto, PP or DP) under a quarter of the resident run's memory, against that resident run at the
    same minibatch (b32: minibatch 32-64 in microbatches of 8)."""
    name = (f"Harmony under {CAPPED_MEMORY:.0%} of resident memory >= {CAPPED_FRACTION:.0%} of resident throughput "
            "(same minibatch)")
    c, p = load_run(out, steps, "c_auto")
    r, pr = load_run(out, steps, "b32")
    if c is None or r is None:
        v.add(name, "FAILED", "; ".join(x for x in (p and f"capped run (c_auto): {p}",
                                                    pr and f"resident run at the same minibatch (b32): {pr}") if x))
    else:
        compare_capped(v, name, c, r)
    d, p = load_run(out, steps, "c_dpswap")
    if d is None:
        v.add("dp-swap under the same cap", "FAILED", p)
    else:
        losses = [x["loss"] for x in d["steps"]]
        ok = all(math.isfinite(x) for x in losses)
        v.add("dp-swap under the same cap", "PASSED" if ok else "FAILED",
              f"{mean_step_s(d):.3f} s/step" + ("" if ok else f"; losses {losses}"))
    return c


def compare_capped(v, name, c, r):
    losses = [x["loss"] for x in c["steps"]]
    cp, rp = c["plan"], r["plan"]
    c_step, r_step = mean_step_s(c), mean_step_s(r)
    c_peak, r_peak = c["summary"]["peak_memory_bytes"], r["summary"]["peak_memory_bytes"]
    problems = []
    if not all(math.isfinite(x) for x in losses):
        problems.append(f"losses not finite: {losses}")
    if cp["plan_kind"] not in ("harmony-pp", "harmony-dp"):
        problems.append(f"the capped run is {cp['plan_kind']}, not Harmony")
    if cp["minibatch"] != rp["minibatch"]:
        problems.append(f"minibatch {cp['minibatch']} capped vs {rp['minibatch']} resident: not the same")
    if not CAPPED_MINIBATCH[0] <= cp["minibatch"] <= CAPPED_MINIBATCH[1]:
        problems.append(f"minibatch {cp['minibatch']} outside {CAPPED_MINIBATCH[0]}-{CAPPED_MINIBATCH[1]}")
    if (cp["u_fwd"], cp["u_bwd"]) != (CAPPED_UBATCH, CAPPED_UBATCH):
        problems.append(f"microbatches {cp['u_fwd']}/{cp['u_bwd']}, the target is {CAPPED_UBATCH}")
    if c_peak > CAPPED_MEMORY * r_peak:
        problems.append(f"peak {gib(c_peak)} > {CAPPED_MEMORY:.0%} of the resident run's {gib(r_peak)}")
    frac = r_step / c_step
    if frac < CAPPED_FRACTION:
        problems.append(f"{frac:.0%} < {CAPPED_FRACTION:.0%}")
    v.add(name, "FAILED" if problems else "PASSED",
          f"{cp['title'][:60]}: {c_step:.3f} s/step at a peak of {gib(c_peak)} ({c_peak / r_peak:.0%} of resident's "
          f"{gib(r_peak)}) vs {rp['plan_kind']} {r_step:.3f} s/step, minibatch {cp['minibatch']}: {frac:.0%} of "
          "resident throughput" + ("; " + "; ".join(problems) if problems else ""))


def torch_runs(out, steps):
    """The PyTorch runs at (b)'s B and T that trained, fastest first: [(step_s, label, run)], and notes on the rest."""
    runs, notes = [], []
    for step, label in (("t_torch", "eager"), ("t_torch_compile", "torch.compile")):
        t, p = load_run(out, steps, step)
        if t is None:
            notes.append(f"{label}: {p}")
        elif not t.get("trains") or not (t.get("summary") or {}).get("step_time_s"):
            why = (t.get("oom") or {}).get("message") or "no step"
            notes.append(f"{label}: did not train ({why[:100]})")
        elif label == "torch.compile" and t["summary"].get("compile_within_budget") is False:
            notes.append(f"{label}: compiled in {t['summary']['first_step_time_s']:.0f} s, over its budget")
        else:
            runs.append((t["summary"]["step_time_s"], label, t))
    return sorted(runs, key=lambda x: x[0]), notes


def check_torch(v, out, steps, params):
    """(b) resident against PyTorch at the same B and T in bf16: throughput and the loss curve; PyTorch at the cap."""
    name = f"resident >= {TORCH_FRACTION:.1f}x PyTorch throughput (same B, T, bf16)"
    b, pb = load_run(out, steps, "b_in_memory", "b.json")
    runs, notes = torch_runs(out, steps)
    if b is None or not runs:
        v.add(name, "FAILED", "; ".join(([f"resident: {pb}"] if b is None else []) + notes))
    else:
        t_step, label, t = runs[0]
        b_step = mean_step_s(b)
        B, T = b["plan"]["minibatch"], params.get("seq_len")
        ts = t["settings"]
        problems = []
        if (ts["batch"], ts["seq_len"]) != (B, T):
            problems.append(f"PyTorch ran B={ts['batch']} T={ts['seq_len']}, resident B={B} T={T}")
        if t.get("dtype") != "bf16" or not params.get("bf16_implemented"):
            problems.append(f"not both bf16 (PyTorch {t.get('dtype')}, harmony-run "
                            f"{'bf16' if params.get('bf16_implemented') else 'fp32'})")
        if t["model"]["num_parameters"] != b["summary"]["num_parameters"]:
            problems.append(f"PyTorch's model has {t['model']['num_parameters']} parameters, harmony-run's "
                            f"{b['summary']['num_parameters']}")
        ratio = t_step / b_step
        if ratio < TORCH_FRACTION:
            problems.append(f"{ratio:.2f}x < {TORCH_FRACTION:.1f}x")
        v.add(name, "FAILED" if problems else "PASSED",
              f"{b['plan']['plan_kind']} {B / b_step:.2f} samples/s ({b_step:.3f} s/step) vs PyTorch {label} "
              f"{B / t_step:.2f} ({t_step:.3f} s/step; torch {t['torch_version']}, {ts['attention']} attention, "
              f"{ts['adamw']} AdamW): {ratio:.2f}x" + "".join(f"; {x}" for x in problems + notes))
    check_loss_curves(v, out, steps, b)
    check_torch_cap(v, out, steps)


def check_loss_curves(v, out, steps, b):
    name = f"loss curves: resident = PyTorch within {LOSS_CURVE_RTOL:.0%} over {LOSS_CURVE_STEPS} steps"
    t, p = load_run(out, steps, "t_torch")
    if b is None or t is None:
        v.add(name, "FAILED", p or "no resident run")
        return
    lb, lt = [x["loss"] for x in b["steps"]], [x["loss"] for x in t["steps"]]
    if len(lb) != len(lt) or len(lb) < LOSS_CURVE_STEPS:
        v.add(name, "FAILED", f"{len(lb)} resident and {len(lt)} PyTorch steps, want {LOSS_CURVE_STEPS} each")
    elif not all(math.isfinite(x) for x in lb + lt):
        v.add(name, "FAILED", f"not finite: resident {lb}, PyTorch {lt}")
    else:
        rel = [abs(x - y) / abs(y) for x, y in zip(lb, lt)]
        k = max(range(len(rel)), key=rel.__getitem__)
        v.add(name, "PASSED" if rel[k] <= LOSS_CURVE_RTOL else "FAILED",
              f"worst step {k + 1}: resident {lb[k]:.4f} vs PyTorch {lt[k]:.4f} ({rel[k]:.2%}); step {len(lb)}: "
              f"{lb[-1]:.4f} vs {lt[-1]:.4f} (from {lb[0]:.4f})")


def check_torch_cap(v, out, steps):
    """PyTorch at the capped run's minibatch, microbatches and memory: where Harmony is for, PyTorch does not train."""
    name = "PyTorch at Harmony's cap: out of memory"
    t, p = load_run(out, steps, "t_torch_cap")
    if t is None:
        v.add(name, "FAILED", p)
        return
    ts = t["settings"]
    cap = ts.get("memory_cap_bytes")
    what = f"minibatch {ts['batch']} in microbatches of {ts['microbatch']}, capped at {cap / 2**20:.0f} MiB" \
        if cap else "no cap"
    c = load_json(out, "c_auto.json")
    harmony_cap = ((c or {}).get("summary") or {}).get("gpu_capacity_bytes")
    if not cap or (harmony_cap and harmony_cap != cap):
        v.add(name, "FAILED", f"{what}: not Harmony's cap ({harmony_cap} bytes)")
    elif (c and c["plan"]["minibatch"] != ts["batch"]):
        v.add(name, "FAILED", f"{what}: Harmony's capped run has minibatch {c['plan']['minibatch']}")
    elif t.get("trains"):
        v.add(name, "FAILED", f"{what}: PyTorch trains ({t['summary']['step_time_s']:.3f} s/step), so this cap shows "
              "nothing Harmony is needed for")
    else:
        o = t.get("oom") or {}
        where = f"in step {o['step']}" if o.get("step") else "while setting up (weights, optimizer)"
        v.add(name, "PASSED", f"{what}: out of memory {where}: {str(o.get('message'))[:80]}")


def staging(trace, kind):
    """(bytes, seconds, ops) of the trace's ops of `kind` (WB: weights up, dWB: gradients down)."""
    ev = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    unit = 1e-6 if (trace.get("otherData") or {}).get("time_unit", "us") == "us" else 1e-3
    ops = [e for e in ev if e.get("ph") == "X" and (e.get("args") or {}).get("kind") == kind]
    return sum(e["args"].get("bytes", 0) for e in ops), sum(e.get("dur", 0) for e in ops) * unit, len(ops)


def check_staging(v, out, bench, params):
    """bf16 staging in (c)'s trace: bytes of WB and dWB over their summed durations, against the pinned ceilings."""
    trace = load_json(out, "c_auto.trace.json")
    for kind, label, link in (("WB", "weights up", "h2d"), ("dWB", "gradients down", "d2h")):
        name = f"bf16 staging {kind} ({label}) >= {STAGING_FRACTION:.0%} of pinned {link.upper()}"
        ceiling = (bench or {}).get(f"{link}_ceiling_GBps")
        if not params.get("bf16_implemented"):
            v.add(name, "FAILED", "the CUDA device does not train bf16: nothing is staged")
        elif trace is None:
            v.add(name, "FAILED", "c_auto.trace.json missing or not JSON (the capped run's --trace)")
        elif not ceiling:
            v.add(name, "FAILED", "no pinned ceiling (bench_cuda.json)")
        else:
            nbytes, secs, n = staging(trace, kind)
            if n == 0 or secs <= 0:
                v.add(name, "FAILED", f"no {kind} ops in c_auto.trace.json")
                continue
            rate = nbytes / secs / 1e9
            v.add(name, "PASSED" if rate >= STAGING_FRACTION * ceiling else "FAILED",
                  f"{n} ops, {nbytes / 2**20:.0f} MiB in {secs * 1e3:.1f} ms: {rate:.1f} GB/s vs {ceiling:.1f} GB/s "
                  f"pinned ceiling ({rate / ceiling:.0%})")


def check_sim(v, out, steps, c):
    # d_sim prices the run's Program at its cap; when harmony-sim's memory account refuses it there (a disagreement
    # with the run, which fitted), d_sim_uncapped prices it without the cap: the time row still gets its number, and
    # the disagreement is named in it.
    p = step_problem(steps, "d_profile")
    capped = step_problem(steps, "d_sim")
    note = ""
    if p is None and capped is not None:
        uncapped = step_problem(steps, "d_sim_uncapped")
        if uncapped is None:
            note = f"; harmony-sim's memory account refused the cap the run fitted ({capped}), priced without it"
        else:
            p = capped
    sim = load_json(out, "d_sim.json") if p is None else None
    name = f"harmony-sim prediction within {SIM_ERROR:.0%}"
    if sim is None or c is None:
        v.add(name, "FAILED", p or ("needs the capped run" if c is None else "d_sim.json is not JSON"))
        return
    pred = sim["result"]["iteration_time_s"]
    meas = mean_step_s(c)
    err = (pred - meas) / meas
    v.add(name, "PASSED" if abs(err) <= SIM_ERROR else "FAILED",
          f"{pred:.3f} s predicted vs {meas:.3f} s measured: {err:+.1%}{note}")


def check_calibrated(v, out, steps, c):
    """(e): calibrate fitted on (b) and (c) dp-swap; its --check prediction of (c) Harmony, not fitted on."""
    name = f"calibrated prediction of (c) within {SIM_ERROR:.0%}"
    p = step_problem(steps, "e_calibrate") or step_problem(steps, "e_predict")
    pred = load_json(out, "e_predict.json") if p is None else None
    runs = (pred or {}).get("runs") or []
    if c is None or len(runs) != 1:
        v.add(name, "FAILED", p or ("needs the capped run" if c is None else "e_predict.json has no run"))
        return
    meas, sim = runs[0]["measured_step_time_s"], runs[0]["predicted_step_time_s"]
    err = (sim - meas) / meas if meas > 0 else math.inf
    v.add(name, "PASSED" if abs(err) <= SIM_ERROR else "FAILED",
          f"{sim:.3f} s predicted on the fitted machine vs {meas:.3f} s measured (fastest step): {err:+.1%}")


def check_losses(v, out, steps, bf16, resident, extra=()):
    """Every plan kind (resident too, where harmony-run has it; `extra`, the kinds the check added since the first runs:
    params fsdp_rows, extra_loss_kinds) in fp32
    on the serial executor, harmony-pp also on the concurrent one, and, when the CUDA device trains bf16 (params
    bf16_implemented), every kind in bf16; then the same for the Llama family (configs/run/llama.yaml, files
    loss_llama_KIND_*), within the GPT-2 rows' bounds."""
    kinds = PLAN_KINDS + list(extra) + (["resident"] if resident else [])
    for kind in kinds:
        check_loss_row(v, out, steps, kind, f"losses {kind}: finite, CUDA = CPU over 3 steps", LOSS_RTOL)
    check_loss_row(v, out, steps, f"concurrent_{CONCURRENT_KIND}",
                   f"losses {CONCURRENT_KIND}, concurrent executor: finite, CUDA = CPU over 3 steps", LOSS_RTOL,
                   cpu_tag=CONCURRENT_KIND)
    if bf16:
        for kind in kinds:
            check_loss_row(v, out, steps, f"bf16_{kind}", f"losses {kind} in bf16: finite, CUDA = CPU (bf16) over 3 steps",
                           LOSS_RTOL_BF16)
    for kind in kinds:
        check_loss_row(v, out, steps, f"llama_{kind}", f"losses Llama {kind}: finite, CUDA = CPU over 3 steps",
                       LOSS_RTOL)
    if bf16:
        for kind in kinds:
            check_loss_row(v, out, steps, f"bf16_llama_{kind}",
                           f"losses Llama {kind} in bf16: finite, CUDA = CPU (bf16) over 3 steps", LOSS_RTOL_BF16)


def check_loss_row(v, out, steps, tag, name, rtol, cpu_tag=None):
    """loss_TAG_cuda against loss_CPU_TAG_cpu (the same tag unless given)."""
    cpu_tag = cpu_tag or tag
    p = step_problem(steps, f"loss_{tag}_cuda") or step_problem(steps, f"loss_{cpu_tag}_cpu")
    g, c = (load_json(out, f"loss_{tag}_cuda.json"), load_json(out, f"loss_{cpu_tag}_cpu.json")) if p is None else \
        (None, None)
    if g is None or c is None:
        v.add(name, "FAILED", p or "output is not JSON")
        return
    lg, lc = [x["loss"] for x in g["steps"]], [x["loss"] for x in c["steps"]]
    if len(lg) != 3 or len(lc) != 3:
        v.add(name, "FAILED", f"{len(lg)} CUDA and {len(lc)} CPU steps, want 3")
    elif not all(math.isfinite(x) for x in lg + lc):
        v.add(name, "FAILED", f"not finite: CUDA {lg}, CPU {lc}")
    else:
        worst = max(abs(a - b) / abs(b) for a, b in zip(lg, lc))
        v.add(name, "PASSED" if worst <= rtol else "FAILED",
              f"worst relative difference {worst:.1e} (tolerance {rtol:.0e}); CUDA {lg[-1]:.6f}, CPU {lc[-1]:.6f}")


OUT = "."  # the folder being judged (for the logs step_problem quotes)
DEADLINE = DEADLINE_S  # the deadline of the run being judged


def verdict(out):
    global OUT, DEADLINE
    OUT = out
    v = Verdict()
    env = load_json(out, "env.json")
    params = load_json(out, "params.json") or {}
    DEADLINE = min(int(params.get("deadline_s") or DEADLINE_S), DEADLINE_S)
    steps = load_steps(out)
    if not check_env(v, env):
        return v  # nothing else was run
    p = step_problem(steps, "build")
    binaries = params.get("binaries")  # built here, a bundle (scripts/make-gpu-bundle.sh), or prebuilt (SKIP_BUILD)
    what = "build (release, CUDA)" if binaries in (None, "built") else f"binaries ({binaries}): present, load (ldd)"
    v.add(what, "PASSED" if p is None else "FAILED", (last_line("build") or "ok") if p is None else p)
    if p is not None:
        return v
    if params.get("device", "cuda") != "cuda":
        v.add("device", "FAILED", f"DEVICE={params['device']}: a dry run of the check on the CPU device, not a GPU "
              "measurement")
    if params.get("resident_implemented") is False:
        v.add("resident plan kind (plan.mode=resident)", "FAILED",
              "harmony-run refuses plan.mode=resident" + (first_error("resident_probe") or "")
              + ": the resident rows measured Harmony-PP with one pack on one GPU instead")
    for t in TESTS:
        s = steps.get(f"test_{t}")
        if s is not None and s.get("rc") == 77:
            v.add(f"test {t}", "FAILED", f"skipped itself (exit 77) on a machine with a GPU: see test_{t}.log")
        else:
            p = step_problem(steps, f"test_{t}")
            v.add(f"test {t}", "PASSED" if p is None else "FAILED", f"{s.get('s', 0):.0f} s" if p is None else p)
    p = step_problem(steps, "bench_cuda")
    bench = load_json(out, "bench_cuda.json") if p is None else None
    if bench is None:
        v.add("bench_cuda", "FAILED", p or "bench_cuda.json is not JSON")
    else:
        check_copies(v, bench)
        v.add("cuBLAS GEMM rates (n = %d)" % bench.get("gemm_n", 0), "PASSED",
              f"fp32 {bench['sgemm_TFLOPs']:.1f}, TF32 {bench['tf32_TFLOPs']:.1f}, BF16 {bench.get('bf16_TFLOPs', 0):.1f} "
              "TFLOP/s")
    p = step_problem(steps, "bench_adamw")
    if p is None:
        check_adamw(v, out)
    else:
        v.add("host AdamW", "FAILED", p)
    check_training(v, out, steps, env, params)
    check_torch(v, out, steps, params)
    c = check_capped(v, out, steps)
    check_staging(v, out, bench, params)
    check_sim(v, out, steps, c)
    check_calibrated(v, out, steps, c)
    check_fused(v, out, steps)
    check_losses(v, out, steps, bool(params.get("bf16_implemented")), bool(params.get("resident_implemented")),
                 (["fsdp"] if params.get("fsdp_rows") else []) + list(params.get("extra_loss_kinds") or []))
    elapsed = params.get("elapsed_s")
    if elapsed is None:
        v.add(f"whole check within {DEADLINE} s", "FAILED", "params.json has no elapsed_s")
    else:
        v.add(f"whole check within {DEADLINE} s", "PASSED" if elapsed <= DEADLINE else "FAILED", f"{elapsed:.0f} s")
    return v


def main(argv):
    args = argv[1:]
    md = None
    if "--markdown" in args:
        i = args.index("--markdown")
        if i + 1 >= len(args):
            print("usage: gpu_verdict.py OUT_DIR [--markdown FILE]", file=sys.stderr)
            return 2
        md = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1 or not os.path.isdir(args[0]):
        print("usage: gpu_verdict.py OUT_DIR [--markdown FILE]", file=sys.stderr)
        return 2
    v = verdict(args[0])
    text = v.table()
    sys.stdout.write(text)
    if md:
        with open(md, "w") as f:
            f.write(text)
    n_failed = sum(1 for _, x, _ in v.rows if x == "FAILED")
    print(f"\ngpu-check: {'FAILED' if n_failed else 'PASSED'} ({n_failed} of {len(v.rows)} rows failed)")
    return 1 if n_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
