#!/usr/bin/env python3
"""Prediction against measurement on the CPU device (docs/validation.md), fit then predict: profile the bundled
model with `harmony-run profile`, train every Program of PROGRAMS with `harmony-run train` (trace + step times),
fit configs/machines/cpu-4x.yaml, with this host's core count as `compute: {units: CORES, host_cores: true}`, to the FIT
Programs with `harmony-sim calibrate`, then predict every Program with `harmony-sim calibrate --check` on the
uncalibrated and the calibrated machine. Prints one Markdown table and the
summary of the predicted (not fitted) Programs' errors; the calibrated machine lands in OUT_DIR.

usage: scripts/validate-cpu.py BUILD_DIR [OUT_DIR] [--small] [--reuse]
  BUILD_DIR holds apps/harmony-run and sim/harmony-sim; --small: 1 fitted + 2 predicted Programs, 3 steps,
  profile repeats 1 (CI's check that the loop runs: tests/cli/test_calibrate.py does the same by hand);
  --reuse: take the profile, traces and step times already in OUT_DIR (an earlier run's) and only fit and
  predict again, so that two versions of the model are compared on the same measurements
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = [a for a in sys.argv[1:] if not a.startswith("--")]
SMALL = "--small" in sys.argv
REUSE = "--reuse" in sys.argv
BUILD = os.path.abspath(args[0])
OUT = os.path.abspath(args[1]) if len(args) > 1 else tempfile.mkdtemp(prefix="harmony-validate-")
RUN = os.path.join(BUILD, "apps/harmony-run")
SIM = os.path.join(BUILD, "sim/harmony-sim")
MACHINE = os.path.join(ROOT, "configs/machines/cpu-4x.yaml")
STEPS = 3 if SMALL else 8  # the first step is a warm-up and left out
REPEATS = 1 if SMALL else 9

# (name, role, plan keys, device memory): fit on at most 3, predict the rest; all seven plan kinds, 1-4 devices,
# several packs and microbatch sizes, every device capped below the model (1.6 MiB of weights + 3.3 MiB of state)
PROGRAMS = [
    ("Harmony-PP N4 u2/2, 1-layer packs", "fit",
     "mode: harmony-pp, gpus: 4, minibatch: 8, u_fwd: 2, u_bwd: 2, pack_size: 1", "1MiB"),
    ("Harmony-DP N2 u2/2, 5-layer packs", "fit",
     "mode: harmony-dp, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, pack_size: 5", "8MiB"),
    ("dp-swap N2 u2", "fit", "mode: dp-swap, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2", "2MiB"),
    ("Harmony-PP N2 u4/1, 3-layer packs", "predict",
     "mode: harmony-pp, gpus: 2, minibatch: 8, u_fwd: 4, u_bwd: 1, pack_size: 3", "4MiB"),
    ("Harmony-PP N1 u2/2, 2-layer packs", "predict",
     "mode: harmony-pp, gpus: 1, minibatch: 8, u_fwd: 2, u_bwd: 2, pack_size: 2", "2MiB"),
    ("Harmony-PP N3 u2/1, 2-layer packs", "predict",
     "mode: harmony-pp, gpus: 3, minibatch: 6, u_fwd: 2, u_bwd: 1, pack_size: 2", "2MiB"),
    ("Harmony-DP N4 u1/1, 3-layer packs", "predict",
     "mode: harmony-dp, gpus: 4, minibatch: 8, u_fwd: 1, u_bwd: 1, pack_size: 3", "4MiB"),
    ("dp-swap N4 u1", "predict", "mode: dp-swap, gpus: 4, minibatch: 8, u_fwd: 1, u_bwd: 1", "2MiB"),
    ("pp-swap N2 u2", "predict", "mode: pp-swap, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2", "16MiB"),
    ("pp-swap N4 u1", "predict", "mode: pp-swap, gpus: 4, minibatch: 8, u_fwd: 1, u_bwd: 1", "16MiB"),
    ("zero-infinity N2 u2", "predict", "mode: zero-infinity, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2", "2MiB"),
    ("l2l N1 u4", "predict", "mode: l2l, gpus: 1, minibatch: 8, u_fwd: 4, u_bwd: 4", "2MiB"),
    ("lohan N2 u4", "predict", "mode: lohan, gpus: 2, minibatch: 8, u_fwd: 4, u_bwd: 4", "2MiB"),
]
if SMALL:
    PROGRAMS = [PROGRAMS[1], PROGRAMS[4], PROGRAMS[8]]


def sh(*argv):
    r = subprocess.run(list(argv), capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{r.stderr}")
    return r.stdout


def cpu_jiffies():
    """(steal, total) jiffies of all CPUs from /proc/stat; (0, 0) where there is none (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return (0, 0)
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user and nice]
    return (fields[7] if len(fields) > 7 else 0, sum(fields[:8]))


def steal_since(start):
    """The share of CPU time the hypervisor took from this VM since `start` (cpu_jiffies())."""
    steal, total = cpu_jiffies()
    return (steal - start[0]) / (total - start[1]) if total > start[1] else 0.0


def train_fastest(cfg, *extra):
    """harmony-run train: (its JSON output, step times after the first, steal share while it ran)."""
    t0 = cpu_jiffies()
    out = sh(RUN, "train", cfg, "--steps", str(STEPS), "--format", "json", "--executor", "concurrent", *extra)
    return out, [s["step_time_s"] for s in json.loads(out)["steps"][1:]], steal_since(t0)


def git(*argv):
    r = subprocess.run(["git", *argv], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip() if r.returncode == 0 else "?"


os.makedirs(OUT, exist_ok=True)
profile = os.path.join(OUT, "cpu_profile.json")
if REUSE and not os.path.exists(profile):
    sys.exit(f"--reuse: {profile} does not exist (run once without --reuse to measure)")
steal = {}  # what the hypervisor took while each measurement ran (kept in OUT/steal.json for --reuse)
steal_path = os.path.join(OUT, "steal.json")
if REUSE and os.path.exists(steal_path):
    steal = json.load(open(steal_path))
if not REUSE:
    t0 = cpu_jiffies()
    sh(RUN, "profile", os.path.join(ROOT, "configs/run/default.yaml"), "--out", profile, "--gpu-memory", "64MiB",
       "--repeats", str(REPEATS), "--rounds", str(REPEATS))
    steal["profile"] = steal_since(t0)
runs = []  # (name, role, config, trace, run json, fastest step, median step, ops)
for i, (name, role, plan, mem) in enumerate(PROGRAMS):
    cfg = os.path.join(OUT, f"program_{i}.yaml")
    with open(cfg, "w") as f:
        f.write("model:\n  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}\n"
                f"  seq_len: 32\n  init_seed: 1\n  profile: {profile}\n"
                f"machine: {{file: {MACHINE}, gpu_memory: {mem}}}\ndevice: cpu\ncost_model: native\n"
                f"plan: {{{plan}}}\ntrain:\n  steps: {STEPS}\n  lr: 3e-3\n  weight_decay: 0.0\n"
                "  data: {synthetic_tokens: 65536, seed: 1}\n")
    trace = os.path.join(OUT, f"run_{i}.trace.json")
    run_json = os.path.join(OUT, f"run_{i}.json")
    # harmony-run traces the fastest step after the first, the step calibrate measures the run by (until stop 24
    # the trace was of the last step, and this script trained again while that one was > 25% slower).
    if not REUSE:
        out, times, steal[f"run_{i}"] = train_fastest(cfg, "--trace", trace)
    else:
        out = open(run_json).read()
        times = [s["step_time_s"] for s in json.loads(out)["steps"][1:]]
    with open(run_json, "w") as f:
        f.write(out)
    ops = sum(1 for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X")
    runs.append((name, role, cfg, trace, run_json, min(times), statistics.median(times), ops))

# A second pass over every Program after the first, untraced: how far the same measurement moves minutes
# later on this machine (the noise floor any prediction is judged against; --small skips it).
second = {}
second_path = os.path.join(OUT, "second.json")
if REUSE and os.path.exists(second_path):
    second = json.load(open(second_path))
elif not REUSE and not SMALL:
    for i, r in enumerate(runs):
        _out, times, steal[f"second_{i}"] = train_fastest(r[2])
        second[str(i)] = min(times)
    with open(second_path, "w") as f:
        json.dump(second, f)
with open(steal_path, "w") as f:
    json.dump(steal, f)

# The machine calibrate starts from: cpu-4x.yaml and a fact, the host's core count, which the CPU device's
# compute, copy and optimizer threads all share (compute.host_cores; calibrate keeps the given units)
CORES = os.cpu_count() or 1
host_machine = os.path.join(OUT, "cpu-4x-host.yaml")
with open(MACHINE) as src, open(host_machine, "w") as f:
    kept = [line for line in src.read().splitlines() if not line.startswith("compute:")]
    f.write("\n".join(kept) + f"\n# written by scripts/validate-cpu.py: this host's {CORES} cores\n"
            f"compute: {{units: {CORES}, host_cores: true}}\n")
fitted = os.path.join(OUT, "cpu-4x-calibrated.yaml")
fit_args = [arg for r in runs if r[1] == "fit" for arg in ("--run", f"{r[2]},{r[3]},{r[4]}")]
print(sh(SIM, "calibrate", host_machine, *fit_args, "--out", fitted))
all_args = [arg for r in runs for arg in ("--run", f"{r[2]},{r[3]},{r[4]}")]
before = json.loads(sh(SIM, "calibrate", host_machine, *all_args, "--check", "--format", "json"))["runs"]
after = json.loads(sh(SIM, "calibrate", fitted, *all_args, "--check", "--format", "json"))["runs"]

print(f"commit {git('rev-parse', '--short', 'HEAD')}, {sh('date', '-u', '+%Y-%m-%d %H:%M UTC').strip()}, "
      f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; profile {profile} ({REPEATS} repeats); "
      f"{STEPS - 1} timed steps per Program (the fastest is the measurement); outputs in {OUT}\n")
def pct(x):
    return f"{100 * x:.0f}%" if x is not None else "-"


print("| Program | role | ops | measured s/step (fastest; median) | steal | 2nd pass (fastest) | predicted, "
      "uncalibrated | error | predicted, calibrated | error |")
print("|---|---|---|---|---|---|---|---|---|---|")
errors, errors_before, moves = [], [], []
for i, ((name, role, _c, _t, _j, m, med, n), b, a) in enumerate(zip(runs, before, after)):
    eb = b["predicted_step_time_s"] / m - 1
    ea = a["predicted_step_time_s"] / m - 1
    if role == "predict":
        errors.append(abs(ea))
        errors_before.append(abs(eb))
    again = second.get(str(i))
    if again is not None:
        moves.append(abs(again / m - 1))
    again_text = f"{again:.4f} ({100 * (again / m - 1):+.0f}%)" if again is not None else "-"
    print(f"| {name} | {role} | {n} | {m:.4f}; {med:.4f} | {pct(steal.get(f'run_{i}'))} | {again_text} | "
          f"{b['predicted_step_time_s']:.4f} | {100 * eb:+.0f}% | {a['predicted_step_time_s']:.4f} | {100 * ea:+.0f}% |")
if errors:
    print(f"\npredicted Programs: {len(errors)}, median |error| {100 * statistics.median(errors):.1f}%, "
          f"worst {100 * max(errors):.1f}% (uncalibrated: {100 * statistics.median(errors_before):.1f}%, "
          f"{100 * max(errors_before):.1f}%)")
if moves:
    print(f"repeatability: the second pass moved the fastest step by a median {100 * statistics.median(moves):.1f}%, "
          f"at most {100 * max(moves):.1f}%; steal while profiling {pct(steal.get('profile'))}")
print(f"calibrated machine: {fitted}")
