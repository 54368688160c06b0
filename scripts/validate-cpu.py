#!/usr/bin/env python3
"""Prediction against measurement on the CPU device (docs/validation.md): profile the bundled model with
`harmony-run profile`, then for three Programs compare harmony-sim's native prediction (fed that profile and
configs/run/cpu-4x.yaml) with harmony-run's measured step time. Prints one Markdown table.

usage: scripts/validate-cpu.py BUILD_DIR [OUT_DIR]   (BUILD_DIR holds apps/harmony-run and sim/harmony-sim)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(sys.argv[1])
OUT = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="harmony-validate-")
RUN = os.path.join(BUILD, "apps/harmony-run")
SIM = os.path.join(BUILD, "sim/harmony-sim")
DEFAULT = os.path.join(ROOT, "configs/run/default.yaml")
MACHINE = os.path.join(ROOT, "configs/run/cpu-4x.yaml")
STEPS = 8  # the first step is a warm-up and left out of the mean

PLANS = [  # (name, plan keys, device memory)
    ("Harmony-PP N4 u2/2, 1-layer packs", "mode: harmony-pp, gpus: 4, minibatch: 8, u_fwd: 2, u_bwd: 2, pack_size: 1",
     "1MiB"),
    ("Harmony-PP N2 u4/1, 3-layer packs", "mode: harmony-pp, gpus: 2, minibatch: 8, u_fwd: 4, u_bwd: 1, pack_size: 3",
     "4MiB"),
    ("Harmony-DP N2 u2/2, 5-layer packs", "mode: harmony-dp, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, pack_size: 5",
     "8MiB"),
]


def sh(*args):
    r = subprocess.run(list(args), capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


os.makedirs(OUT, exist_ok=True)
profile = os.path.join(OUT, "cpu_profile.json")
sh(RUN, "profile", DEFAULT, "--out", profile, "--gpu-memory", "64MiB", "--repeats", "7")
rows = []
for name, plan, mem in PLANS:
    keys = "{" + plan + "}"
    run = json.loads(sh(RUN, "train", DEFAULT, "--steps", str(STEPS), "--format", "json", "--executor", "concurrent",
                        "--gpu-memory", mem,
                        "--set", f"plan={keys}", "--trace", os.path.join(OUT, f"run_{len(rows)}.json")))
    times = [s["step_time_s"] for s in run["steps"][1:]]
    measured = statistics.mean(times)
    cfg = os.path.join(OUT, f"sim_{len(rows)}.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {{profile: {profile}}}\nmachine: {{file: {MACHINE}, gpu_memory: {mem}}}\n"
                f"cost_model: native\nplan: {keys}\n")
    trace = os.path.join(OUT, f"sim_{len(rows)}.json")
    sim = json.loads(sh(SIM, "simulate", cfg, "--format", "json", "--trace", trace))["result"]
    predicted = sim["iteration_time_s"]
    # The CPU executor runs one op at a time on one host thread: its time is the sum of the ops' durations.
    ops = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    serial = sum(e["dur"] for e in ops) / 1e6
    run_ops = [e for e in json.load(open(os.path.join(OUT, f"run_{len(rows)}.json")))["traceEvents"]
               if e.get("ph") == "X"]
    compute = {"FWD", "REC", "BWD"}
    def total(events, kinds):
        return sum(e["dur"] for e in events if e["name"].split()[1] in kinds) / 1e6
    rows.append((name, measured, statistics.pstdev(times), predicted, serial, total(ops, compute),
                 total(run_ops, compute), len(ops)))

print(f"profile: {profile}; {STEPS - 1} timed steps per plan; outputs in {OUT}\n")
print("| Program | ops | measured s/step (± sd) | predicted (native, parallel) | error | predicted, serialised | error "
      "| compute predicted / measured |")
print("|---|---|---|---|---|---|---|---|")
for name, m, sd, p, s, cp, cm, n in rows:
    print(f"| {name} | {n} | {m:.4f} ± {sd:.4f} | {p:.4f} | {100 * (p - m) / m:+.0f}% | {s:.4f} | "
          f"{100 * (s - m) / m:+.0f}% | {cp:.4f} / {cm:.4f} |")
