#!/usr/bin/env python3
# Owns the "Published systems" table of docs/validation.md: runs harmony-sim on every configs/validation/*.yaml
# named in configs/validation/published.json (published numbers and their sources; a point's "set" lines go to
# --set), computes each prediction in the source's own metric and writes the table between the marker comments.
# --check exits 1 when the doc's table differs from what the binary computes now; --calibrate prints the preset
# calibration (the fit of gemm_efficiency).
#   python3 scripts/validate-published.py [--build BUILD_DIR] [--check | --calibrate]
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALID = os.path.join(ROOT, "configs", "validation")
DOC = os.path.join(ROOT, "docs", "validation.md")
BEGIN = "<!-- published-systems:begin (scripts/validate-published.py writes this table) -->"
END = "<!-- published-systems:end -->"
# ~10 us fixed cost per GEMM on every newer preset: half = 10 us x peak x max (docs/machines.md)
FIXED_GEMM_S = 10e-6


def run_sim(sim, sub, config, sets=()):
    cmd = [sim, sub, config, "--format", "json"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"validate-published: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return json.loads(r.stdout)


def flops_per_sample(entry):
    sh = entry["shape"]
    l, h, s, v = sh["layers"], sh["hidden"], sh["seq"], sh["vocab"]
    if entry["flops"] == "megatron":  # 96 B s l h^2 (1 + s/6h + V/16lh) per B samples
        return 96.0 * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
    if entry["flops"] == "megatron-nohead":  # the same without the LM head's V/16lh (a model with no head)
        return 96.0 * s * l * h * h * (1.0 + s / (6.0 * h))
    if entry["flops"] == "mpt":  # llm-foundry: 3 x (2 n s) + 3 x (4 l h s^2)
        return 6.0 * sh["params"] * s + 12.0 * l * h * s * s
    raise SystemExit(f"validate-published: unknown flops '{entry['flops']}' in {entry['name']}")


def simulated_seconds(sim, config, measure, sets=(), kind=None, policy=None):
    """How a validation point is priced (docs/validation.md, "Published systems"): `compute` = simulate's per-GPU
    compute time of the config's plan; `kind` = compare's best time of the plan kind under the activation policy.
    Returns (seconds or None when the kind does not fit, samples per GPU, the harmony-sim JSON it came from: the
    simulate result, or compare's row of the kind)."""
    if measure == "compute":
        d = run_sim(sim, "simulate", config, sets)["result"]
        return d["per_gpu"][0]["compute_time_s"], d["minibatch"] / d["gpus"], d
    if measure == "kind":
        d = run_sim(sim, "compare", config, sets)
        res = [r for r in d["results"] if r["plan_kind"] == kind]
        row = res[0] if res else None
        times = (row["policy_best_time_s"] or {}) if row and row["feasible"] else {}
        return times.get(policy), d["minibatch"] / d["gpus"], row
    raise SystemExit(f"validate-published: unknown measure '{measure}' in {config}")


def predict(sim, entry, sets=()):
    """The prediction in the entry's unit (TFLOP/s per GPU) and the simulated seconds it came from."""
    config = os.path.join(VALID, entry["config"])
    sets = tuple(entry.get("set", ())) + tuple(sets)  # the point's own --set lines (batch, drives), then the caller's
    seconds, samples, _ = simulated_seconds(sim, config, entry["measure"], sets, entry.get("kind"), entry.get("policy"))
    if seconds is None:
        return None, None
    return flops_per_sample(entry) * samples / seconds / 1e12, seconds


def pct(x):
    return f"{x * 100:+.0f}%"


def role_of(e, pub):
    """calibration, pending, not independent (its preset was calibrated on its own source: a source that calibrates
    a preset validates nothing on it, issue 35), or "" for a validation point."""
    if e in pub["calibration"]:
        return "calibration"
    if "pending" in e:
        return "pending"
    if any(c["preset"] == e["preset"] and c["source_group"] == e["source_group"] for c in pub["calibration"]):
        return "not independent"
    return ""


def summary_rows(rows):
    """Per source and per group (offloading / non-offloading apart): n, median and worst |error| of the rows
    (name, group, source, error or None for a run our model cannot run)."""
    def stats(errs):
        a = sorted(abs(x) for x in errs if x is not None)
        missing = sum(1 for x in errs if x is None)
        med = f"{statistics.median(a) * 100:.0f}%" if a else "n/a"
        worst = "infeasible" if missing else (f"{a[-1] * 100:.0f}%" if a else "n/a")
        within = sum(1 for x in a if x <= 0.35)
        return f"{len(errs)} | {med} | {worst} | {within} of {len(errs)}"
    lines = ["| group | source | n | median \\|error\\| | worst \\|error\\| | within 35% |", "|---|---|---|---|---|---|"]
    for group in ("offloading", "non-offloading", "not independent"):
        mine = [r for r in rows if r[1] == group]
        if not mine:
            continue
        for source in sorted({r[2] for r in mine}):
            lines.append(f"| {group} | `{source}` | {stats([r[3] for r in mine if r[2] == source])} |")
        lines.append(f"| **{group}** | all | {stats([r[3] for r in mine])} |")
    return lines


def build_table(sim, pub):
    lines = []
    lines.append("| point | system | hardware | model, batch, precision | published | harmony-sim | error |")
    lines.append("|---|---|---|---|---|---|---|")
    preds, rows = {}, []
    for e in pub["calibration"] + pub["points"]:
        p, sec = predict(sim, e)
        sh = e["shape"]
        shape = f"{sh['layers']} x {sh['hidden']}, seq {sh['seq']}, batch {e['batch']}, {e['precision']}"
        role = role_of(e, pub)
        err_value = None
        if p is None:
            pred, err = "infeasible", "n/a"
        else:
            preds[e["name"]] = p
            pred = f"{p:.1f} ({sec:.3f} s)"
            err = pct(p / e["published"] - 1)
            err_value = p / e["published"] - 1
        if role in ("", "not independent"):  # a measured run the model cannot run is a miss, not a skipped row
            group = role or ("offloading" if e["offloading"] else "non-offloading")
            rows.append((e["name"], group, e["source_group"], err_value))
        tag = f" ({role})" if role else ""
        lines.append(f"| `{e['name']}`{tag} | {e['system']} | {e['hardware']} | {shape} | "
                     f"{e['published']:g} {e['unit']} | {pred} | {err} |")
    lines.append("")
    lines.append("| ratio (same hardware) | published | harmony-sim | error |")
    lines.append("|---|---|---|---|")
    rerrs = []
    for r in pub["ratios"]:
        if "pending" in r or r["numerator"] not in preds or r["denominator"] not in preds:
            lines.append(f"| {r['name']} | {r['published']:g}x | pending: {r.get('pending', 'infeasible')} | n/a |")
            continue
        q = preds[r["numerator"]] / preds[r["denominator"]]
        rerrs.append(q / r["published"] - 1)
        lines.append(f"| {r['name']} | {r['published']:g}x | {q:.2f}x | {pct(q / r['published'] - 1)} |")
    lines.append("")
    lines.extend(summary_rows(rows))
    lines.append("")
    valid = [r for r in rows if r[1] != "not independent"]
    if valid:
        a = sorted(abs(r[3]) for r in valid if r[3] is not None)
        missing = [r[0] for r in valid if r[3] is None]
        n = len(valid)
        infeasible = (f"; {len(missing)} infeasible in our model though measured ({', '.join(missing)}), counted "
                      "as misses" if missing else "")
        median = f"{statistics.median(a) * 100:.0f}%" if a else "n/a"
        worst = "infeasible" if missing else f"{a[-1] * 100:.0f}%"
        apart = len(rows) - n
        lines.append(f"Validation points (calibration, pending and not-independent rows excluded): {n} from "
                     f"{len({r[2] for r in valid})} sources; median |error| of the "
                     f"{len(a)} predicted {median} (target 15%), worst {worst} (target 35%), "
                     f"{sum(1 for x in a if x <= 0.35)} of {n} within 35%{infeasible}; {apart} not independent "
                     f"(their preset was calibrated on their own source), reported apart; ratios within 25%: "
                     f"{sum(1 for x in rerrs if abs(x) <= 0.25)} of {len(pub['ratios'])}.")
    return "\n".join(lines) + "\n"


def calibrate(sim, pub):
    """Bisection on gemm_efficiency.max (half moved with it) until the calibration run's prediction equals its
    published number; prints the fitted values for the preset files."""
    for e in pub["calibration"]:
        peak = e["peak_tflops"] * 1e12  # the preset's matrix_fp16
        lo, hi = 0.05, 1.0
        for _ in range(30):
            mid = (lo + hi) / 2
            sets = [f"machine.gpu_rates.gemm_efficiency.max={mid}",
                    f"machine.gpu_rates.gemm_efficiency.half={FIXED_GEMM_S * peak * mid / 1e9}GFLOP"]
            p, _ = predict(sim, e, sets)
            lo, hi = (mid, hi) if p < e["published"] else (lo, mid)
        if hi > 0.999:  # even GEMMs at the full peak do not reach the measurement
            print(f"{e['preset']}: no gemm_efficiency.max <= 1 reproduces {e['name']} ({e['published']:g} {e['unit']})")
            continue
        print(f"{e['preset']}: gemm_efficiency {{max: {lo:.3f}, half: {FIXED_GEMM_S * peak * lo / 1e9:.2f}GFLOP}}"
              f" reproduces {e['name']} ({e['published']:g} {e['unit']})")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sim", help="the harmony-sim binary (default: BUILD/sim/harmony-sim)")
    ap.add_argument("--doc", default=DOC, help="the markdown file holding the table (default: docs/validation.md)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when docs/validation.md's table is not current")
    mode.add_argument("--calibrate", action="store_true", help="print the fitted gemm_efficiency of each preset")
    args = ap.parse_args()
    sim = args.sim or os.path.join(args.build, "sim", "harmony-sim")
    if not os.path.exists(sim):
        print(f"validate-published: {sim} not found; build it: ninja -C {args.build} sim/harmony-sim", file=sys.stderr)
        return 2
    with open(os.path.join(VALID, "published.json")) as f:
        pub = json.load(f)
    if args.calibrate:
        calibrate(sim, pub)
        return 0
    table = build_table(sim, pub)
    with open(args.doc) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        print(f"validate-published: {args.doc} lacks the markers {BEGIN} ... {END}", file=sys.stderr)
        return 2
    head, rest = doc.split(BEGIN, 1)
    old, tail = rest.split(END, 1)
    new_doc = head + BEGIN + "\n" + table + END + tail
    if args.check:
        if old.strip() != table.strip():
            print(f"validate-published: the table in {args.doc} is not what harmony-sim computes now; "
                  "regenerate it: python3 scripts/validate-published.py", file=sys.stderr)
            print(table)
            return 1
        print(f"validate-published: {args.doc} is current ({len(pub['points'])} points)")
        return 0
    with open(args.doc, "w") as f:
        f.write(new_doc)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
