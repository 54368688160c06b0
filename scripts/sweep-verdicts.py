#!/usr/bin/env python3
# Owns the verdict table of docs/comparison.md ("What the analytic sweep says now"): reads a sweep's results.jsonl
# and prints, per (model, machine), the best Harmony kind's iteration time against the best baseline's, each at its
# own best GPU count, as a markdown table (bold where Harmony is faster), then each cell's winners.
#   harmony-sim sweep configs/sweeps/gpt_1b_100b.yaml --out DIR && python3 scripts/sweep-verdicts.py DIR
import json
import os
import sys

HARMONY = {"harmony-pp", "harmony-dp"}


def best(rows):
    """The fastest feasible row (ties: the first in sweep order), or None."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("feasible")]
    return min(ok, key=lambda r: r["iteration_time_s"]) if ok else None


def main():
    if len(sys.argv) != 2:
        print("usage: sweep-verdicts.py SWEEP_DIR (a harmony-sim sweep --out folder)", file=sys.stderr)
        return 2
    path = os.path.join(sys.argv[1], "results.jsonl")
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        print(f"sweep-verdicts: cannot read {path}: {e.strerror}; run the sweep first", file=sys.stderr)
        return 2
    models, machines, cells = [], [], {}
    for r in rows:
        m, k = r.get("model_name"), r.get("machine_name")
        if m is None or k is None:  # an invalid point (N above the machine's GPUs, ...): nothing was built
            continue
        if m not in models:
            models.append(m)
        if k not in machines:
            machines.append(k)
        cells.setdefault((m, k), []).append(r)
    print("| model | " + " | ".join(machines) + " |")
    print("|---|" + "---|" * len(machines))
    wins = fits = 0
    for m in models:
        out = []
        for k in machines:
            rs = cells.get((m, k), [])
            h = best([r for r in rs if r["plan_kind"] in HARMONY])
            b = best([r for r in rs if r["plan_kind"] not in HARMONY])
            if h and b:
                fits += 1
                ratio = b["iteration_time_s"] / h["iteration_time_s"]
                wins += ratio > 1
                text = f"{ratio:.2f}×"
                out.append(f"**{text}**" if ratio > 1 else text)
                out[-1] += f" ({h['plan_kind']} N = {h['gpus']} vs {b['plan_kind']} N = {b['gpus']})"
            elif h:
                fits += 1
                wins += 1
                out.append(f"only Harmony fits ({h['plan_kind']} N = {h['gpus']})")
            elif b:
                fits += 1
                out.append(f"only baselines fit ({b['plan_kind']} N = {b['gpus']})")
            else:
                out.append("nothing fits")
        print(f"| {m} | " + " | ".join(out) + " |")
    print()
    print(f"Best baseline time / best Harmony time; Harmony is faster in {wins} of the {fits} cells where anything fits.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
