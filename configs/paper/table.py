#!/usr/bin/env python3
"""Prints the table of docs/comparison.md ("The paper's own regime") from the results.csv of the sweeps in
configs/paper/sweeps/: per (model, GPUs, minibatch) Harmony's best kind (harmony-pp or harmony-dp, the faster;
harmony-pp on a tie) against each baseline kind the paper's baseline types map to: the baseline's iteration time
over Harmony's (= Harmony's throughput over the baseline's) and the baseline's host<->GPU swap bytes (in + out)
over Harmony's. Rows of a sweep over `search.swap` (the *_on_demand.yaml sweeps: dp-swap and pp-swap swapping on
demand, docs/baselines.md#swap-timing) become the columns "dp-swap on-demand" and "pp-swap on-demand".

    python3 configs/paper/table.py /tmp/paper-fig10/results.csv /tmp/paper-fig17/results.csv \
        [/tmp/paper-fig10-on-demand/results.csv /tmp/paper-fig17-on-demand/results.csv]
"""
import csv
import sys

BASELINES = ["dp-swap", "pp-swap", "zero-infinity", "l2l"]
ON_DEMAND = ["dp-swap on-demand", "pp-swap on-demand"]


def time_s(row):
    ok = row and row["status"] == "ok" and row["feasible"] == "true"
    return float(row["iteration_time_s"]) if ok else None


def swap_bytes(row):
    return int(row["swap_in_bytes"]) + int(row["swap_out_bytes"])


groups = {}
for path in sys.argv[1:]:
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["model_name"], int(row["gpus"]), int(row["minibatch"]))
            kind = row["plan_kind"]
            if row.get("search.swap") == "on-demand":
                kind += " on-demand"
            groups.setdefault(key, {})[kind] = row
if any(k in kinds for kinds in groups.values() for k in ON_DEMAND):
    BASELINES += ON_DEMAND

print("| model | N | D | Harmony's best (time, u f/b, swap) | " + " | ".join(BASELINES) + " |")
print("|---|---|---|---|" + "---|" * len(BASELINES))
for (model, gpus, minibatch), kinds in groups.items():
    harmony = [(time_s(kinds.get(k)), k != "harmony-pp", k) for k in ("harmony-pp", "harmony-dp")]
    harmony = sorted(h for h in harmony if h[0] is not None)
    if not harmony:
        print(f"| {model} | {gpus} | {minibatch} | no Harmony plan fits |" + " |" * len(BASELINES))
        continue
    best_s, _, best_kind = harmony[0]
    best = kinds[best_kind]
    cells = []
    for kind in BASELINES:
        row = kinds.get(kind)
        t = time_s(row)
        if t is None:
            cells.append("does not fit" if row and row["status"] == "does_not_fit" else "-")
        else:
            cells.append(f"{t / best_s:.2f}x, {swap_bytes(row) / swap_bytes(best):.1f}x swap")
    print(f"| {model} | {gpus} | {minibatch} | {best_kind} {best_s:.1f} s, u {best['u_fwd']}/{best['u_bwd']}, "
          f"{swap_bytes(best) / 2**30:.0f} GiB | " + " | ".join(cells) + " |")
