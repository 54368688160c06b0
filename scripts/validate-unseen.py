#!/usr/bin/env python3
# Owns configs/validation/unseen/predictions.json (issue 35): prices every point of configs/validation/unseen/
# points.json as configs/validation/unseen/pricing.json says (config, --set lines, measure, kind, policy, metric)
# with harmony-sim --format json, converts the simulated seconds into the point's own unit, and adds each
# prediction's sensitivity to the host rates (the machine's cpu_adam bandwidth halved and doubled, every GPU's host
# link halved). Points that are pending, inexpressible or do not fit are listed with why. It never reads the
# measured values (configs/validation/unseen/measured.json): the predictions are committed before any comparison.
#   python3 scripts/validate-unseen.py [--build BUILD_DIR | --sim SIM] [--check] [--only ID ...] [--jobs N]
import argparse
import collections
import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNSEEN = os.path.join(ROOT, "configs", "validation", "unseen")
OUT = os.path.join(UNSEEN, "predictions.json")

# The pricing of configs/validation/published.json's points (run_sim, simulated_seconds, flops_per_sample).
_spec = importlib.util.spec_from_file_location("validate_published", os.path.join(ROOT, "scripts", "validate-published.py"))
vp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vp)

# name, what is scaled (the machine's cpu_adam bandwidth, or its PCIe tree: GPU links and switch uplinks), factor
SENSITIVITY = (("cpu_adam_x0.5", "cpu_adam", 0.5), ("cpu_adam_x2", "cpu_adam", 2.0), ("h2d_x0.5", "pcie", 0.5))
SENS_NAMES = tuple(n for n, _, _ in SENSITIVITY)


def sig(x, digits=6):
    """A float rounded to `digits` significant digits (predictions.json is compared byte for byte)."""
    return float(f"{x:.{digits}g}")


def ps_params(shape):
    """Parameters of a GPT-2-style model with a tied head: L (12h^2 + 13h) + (V + T) h + 2h."""
    l, h = shape["layers"], shape["hidden"]
    return l * (12 * h * h + 13 * h) + (shape["vocab"] + shape["seq"]) * h + 2 * h


def convert(entry, seconds, minibatch):
    """The point's own unit from the simulated seconds of one iteration of `minibatch` samples (all GPUs)."""
    metric = entry["metric"]
    if metric == "seconds":
        return seconds
    if metric == "milliseconds":
        return seconds * 1e3
    if metric == "samples_per_s":
        return minibatch / seconds
    if metric == "tflops_ps8":  # PatrickStar's pretrain_demo.py: 8 x parameters x tokens, summed over GPUs
        return 8.0 * ps_params(entry["shape"]) * minibatch * entry["shape"]["seq"] / seconds / 1e12
    if metric == "tflops_colossal8_per_gpu":  # Colossal-AI's train_gpt_demo.py get_tflops: per data-parallel rank
        return 8.0 * ps_params(entry["shape"]) * minibatch / entry["data_parallel"] * entry["shape"]["seq"] / seconds / 1e12
    if metric == "tokens_per_s":  # all GPUs' tokens: the iteration's samples x the point's sequence length
        return minibatch * entry["seq"] / seconds
    if metric == "seconds_per_micro":  # one training-loop iteration: the optimizer step over its micro-steps
        return seconds / entry["grad_accum"]
    if metric == "epoch_seconds":  # an epoch of `steps` optimizer steps
        return seconds * entry["steps"]
    if metric == "tflops_megatron_nohead":  # summed over GPUs
        flops = vp.flops_per_sample({"flops": "megatron-nohead", "shape": entry["shape"], "name": entry["id"]})
        return flops * minibatch / seconds / 1e12
    raise SystemExit(f"validate-unseen: unknown metric '{metric}' in {entry['id']}")


TIME_UNITS = {"seconds": ("s", "s/it"), "seconds_per_micro": ("s", "s/it"), "epoch_seconds": ("s", "s/it"),
              "milliseconds": ("ms",)}


def unit_problem(entry, unit):
    """Why a priced entry's metric cannot be the points.json unit it will be compared in, or None: a time metric
    must name its own unit (compare-unseen reads a unit's first word to tell times from speeds), a speed none."""
    first = unit.split()[0]
    want = TIME_UNITS.get(entry["metric"])
    if want is not None and first not in want:
        return f"metric {entry['metric']} gives {want[0]}, and the point's unit is '{unit}'"
    if want is None and any(first in w for w in TIME_UNITS.values()):
        return f"metric {entry['metric']} is a speed, and the point's unit '{unit}' is a time"
    return None


def run_one(sim, entry, sets):
    """Prices one config and --set list: {seconds, minibatch, plan, status, reason}."""
    config = os.path.join(UNSEEN, entry["config"])
    try:
        seconds, samples, d = vp.simulated_seconds(sim, config, entry["measure"], sets, entry.get("kind"),
                                                   entry.get("policy"))
    except SystemExit as e:  # harmony-sim refused the config: its message is the reason
        return {"status": "error", "reason": str(e).strip()}
    if entry["measure"] == "compute":
        plan = {"packs_bwd": d["packs_bwd"], "u": d["u_bwd"], "gpus_simulated": d["gpus"],
                "compute_time_s": sig(d["per_gpu"][0]["compute_time_s"])}
        gpus = 1
    else:
        if d is None:
            return {"status": "does not fit", "reason": f"compare has no {entry['kind']} row"}
        if seconds is None:
            reason = d.get("reason") or (d.get("best") or {}).get("infeasible_reason")
            if d["feasible"]:
                reason = f"{entry['kind']} fits only under another activation policy than {entry['policy']}"
            return {"status": "does not fit", "reason": reason or "infeasible"}
        b = d["best"]
        plan = {"u": b["u_bwd"], "offload": d["offload"], "policy_times_s": {k: (sig(v) if v is not None else None)
                                                                                for k, v in sorted(d["policy_best_time_s"].items())},
                "best_policy": b["activation_policy"]}
        if b["activation_policy"] == entry["policy"]:  # the details below are of the plan priced
            plan.update({"compute_time_s": sig(b["per_gpu"][0]["compute_time_s"]),
                         "peak_memory_GiB": sig(b["peak_memory_bytes"] / 2**30, 4),
                         "host_memory_GiB": sig(b["host_memory"]["total_bytes"] / 2**30, 4),
                         "swap_in_GiB": sig(b["swap_in_bytes"] / 2**30, 4),
                         "swap_out_GiB": sig(b["swap_out_bytes"] / 2**30, 4)})
        gpus = b["gpus"]
    minibatch = int(round(samples * gpus))  # the whole iteration's samples (compute points: the per-GPU minibatch)
    if "global_batch" in entry:  # a compute point stands for every GPU of a data-parallel run
        minibatch = entry["global_batch"]
    return {"status": "predicted", "seconds": seconds, "minibatch": minibatch, "plan": plan}


def jobs_of(entry):
    """(key, sets) for the base prediction (every batch of a sweep) and the sensitivity variants."""
    base = list(entry.get("set", ()))
    variants = []
    sweep = entry.get("sweep")
    if sweep:  # every per-GPU batch u of the sweep: u and the global minibatch go into its --set templates
        gpus = int(next(s.split("=", 1)[1] for s in base if s.startswith("plan.gpus=")))
        for u in sweep["per_gpu_batch"]:
            variants.append((("sweep", u), base + [s.format(u=u, minibatch=u * gpus) for s in sweep["set"]]))
    else:
        variants.append((("base", None), base))
    return variants


def sensitivity_sets(entry, machines, sets):
    m = machines[entry["machine"]]
    out = []
    for name, what, factor in SENSITIVITY:
        if what == "cpu_adam":
            extra = f"machine.cpu_adam.bandwidth={sig(m['cpu_adam_bandwidth_GBps'] * factor)}GB/s"
            out.append((name, sets + [extra]))
        else:  # the whole PCIe tree: every GPU's link and every switch's uplink (the switch list is replaced whole)
            up = sig(m["uplink_GBps"] * factor)
            switches = ", ".join(f"{{name: {n}, socket: {k}, uplink: {up}GB/s}}" for n, k in m["pcie_switches"])
            out.append((name, sets + [f"machine.topology.switches=[{switches}]",
                                      f"machine.topology.gpus.all.link={sig(m['gpu_link_GBps'] * factor)}GB/s"]))
    return out


def price_all(sim, pricing, points, only, jobs):
    machines = pricing["machines"]
    entries = [e for e in pricing["points"] if not only or e["id"] in only]
    by_id = {e["id"]: e for e in entries}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    # First pass: every base (and sweep) run at once; second pass: the sensitivity of the chosen one.
    base = {}
    for e in entries:
        if e["status"] in ("priced", "approximate"):
            base[e["id"]] = [(key, sets, pool.submit(run_one, sim, e, sets)) for key, sets in jobs_of(e)]
    chosen = {}
    for e in entries:
        if e["id"] not in base:
            continue
        runs = [(key, sets, f.result()) for key, sets, f in base[e["id"]]]
        ok = [(convert(e, r["seconds"], r["minibatch"]), key, sets, r) for key, sets, r in runs
              if r["status"] == "predicted"]
        if ok:
            pick = max(ok, key=lambda t: t[0]) if e.get("sweep") else ok[0]
            chosen[e["id"]] = (pick, runs)
        else:
            chosen[e["id"]] = (None, runs)
    sens = {}
    for pid, (pick, _) in chosen.items():
        if pick is not None and by_id[pid]["measure"] == "kind":  # a compute point prices no host work
            e = by_id[pid]
            sens[pid] = [(name, pool.submit(run_one, sim, e, sets)) for name, sets in sensitivity_sets(e, machines, pick[2])]
    out = collections.OrderedDict()
    for e in entries:
        p = points[e["id"]]
        rec = collections.OrderedDict([("source", e["source"]), ("offloading", p["offloading"]), ("gpus", p["gpus"]),
                                       ("unit", p["metric"]["unit"]), ("pricing", e["status"])])
        if e["status"] in ("pending", "inexpressible"):
            rec["status"] = e["status"]
            rec["reason"] = e["reason"]
            out[e["id"]] = rec
            continue
        rec.update([("config", e["config"]), ("measure", e["measure"])])
        if e["measure"] == "kind":
            rec.update([("plan_kind", e["kind"]), ("policy", e["policy"])])
        pick, runs = chosen[e["id"]]
        if pick is None:
            r = runs[0][2]
            rec["status"] = r["status"]
            rec["reason"] = r["reason"]
            if e.get("sweep"):
                rec["sweep"] = {str(key[1]): {"status": r["status"], "reason": r["reason"]} for key, _, r in runs}
            out[e["id"]] = rec
            continue
        value, key, sets, r = pick
        rec.update([("status", "predicted"), ("predicted", sig(value)), ("simulated_s", sig(r["seconds"])),
                    ("minibatch", r["minibatch"]), ("plan", r["plan"])])
        if e.get("sweep"):
            rec["per_gpu_batch"] = key[1]
            rec["sweep"] = {str(k[1]): ({"predicted": sig(convert(e, rr["seconds"], rr["minibatch"])),
                                         "simulated_s": sig(rr["seconds"])} if rr["status"] == "predicted" else
                                        {"status": rr["status"], "reason": rr["reason"]}) for k, _, rr in runs}
        s = collections.OrderedDict()
        for name, f in sens.get(e["id"], ()):
            rr = f.result()
            s[name] = sig(convert(e, rr["seconds"], rr["minibatch"])) if rr["status"] == "predicted" else rr["status"]
        rec["sensitivity"] = s or "n/a: a compute point prices the GPU's work only (no host rate enters it)"
        out[e["id"]] = rec
    pool.shutdown()
    return out


def counts(preds):
    c = collections.OrderedDict()
    for rec in preds.values():
        by = c.setdefault(rec["source"], collections.Counter())
        key = rec["status"] if rec["status"] != "predicted" else ("predicted" if rec["pricing"] == "priced"
                                                                  else "predicted (approximate kind)")
        by[key] += 1
    return {s: dict(sorted(v.items())) for s, v in sorted(c.items())}


def table(preds):
    lines = [f"{'point':44} {'status':14} {'predicted':>11} {'unit':26} {'cpu/2':>9} {'cpu*2':>9} {'h2d/2':>9}"]
    for pid, r in preds.items():
        if r["status"] == "predicted":
            s = r["sensitivity"] if isinstance(r["sensitivity"], dict) else dict.fromkeys(SENS_NAMES, "n/a")
            f = [f"{s[k]:9.4g}" if isinstance(s[k], float) else f"{s[k]:>9}" for k in SENS_NAMES]
            st = "approximate" if r["pricing"] == "approximate" else "predicted"
            lines.append(f"{pid:44} {st:14} {r['predicted']:11.4g} {r['unit'][:26]:26} {' '.join(f)}")
        else:
            lines.append(f"{pid:44} {r['status']:14} {'':11} {r['unit'][:26]:26}")
    return "\n".join(lines)


def git_head():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True)
        return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sim", help="the harmony-sim binary (default: BUILD/sim/harmony-sim)")
    ap.add_argument("--out", default=OUT, help="where to write (default: configs/validation/unseen/predictions.json)")
    ap.add_argument("--check", action="store_true",
                    help="recompute and exit 1 when the committed predictions differ (writes nothing)")
    ap.add_argument("--only", action="append", default=[], metavar="ID", help="price only these points")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="harmony-sim runs at once")
    args = ap.parse_args()
    sim = args.sim or os.path.join(args.build, "sim", "harmony-sim")
    if not os.path.exists(sim):
        print(f"validate-unseen: {sim} not found; build it: ninja -C {args.build} sim/harmony-sim", file=sys.stderr)
        return 2
    with open(os.path.join(UNSEEN, "points.json")) as f:
        points = {p["id"]: p for p in json.load(f)["points"]}
    with open(os.path.join(UNSEEN, "pricing.json")) as f:
        pricing = json.load(f)
    priced_ids = [e["id"] for e in pricing["points"]]
    if sorted(priced_ids) != sorted(points) or len(set(priced_ids)) != len(priced_ids):
        missing, extra = sorted(set(points) - set(priced_ids)), sorted(set(priced_ids) - set(points))
        print(f"validate-unseen: pricing.json and points.json disagree: not priced {missing}, unknown {extra}",
              file=sys.stderr)
        return 2
    unknown = sorted(set(args.only) - set(points))
    if unknown:
        print(f"validate-unseen: --only names unknown points {unknown}", file=sys.stderr)
        return 2
    bad_units = [f"{e['id']}: {why}" for e in pricing["points"] if "metric" in e
                 for why in [unit_problem(e, points[e["id"]]["metric"]["unit"])] if why]
    if bad_units:
        print("validate-unseen: pricing.json's metric and points.json's unit disagree (a time metric must name the "
              "unit it is compared in: seconds for 's', milliseconds for 'ms'):\n  " + "\n  ".join(bad_units),
              file=sys.stderr)
        return 2
    preds = price_all(sim, pricing, points, set(args.only), max(1, args.jobs))
    version = subprocess.run([sim, "--version"], capture_output=True, text=True).stdout.strip()
    doc = collections.OrderedDict([
        ("comment", "Predictions of harmony-sim for the unseen published runs of points.json (issue 35), made from "
                    "pricing.json before any measured value was compared (measured.json is never read by "
                    "scripts/validate-unseen.py). predicted: in the point's own unit; simulated_s: the simulated "
                    "iteration (compute points: the per-GPU compute time); pricing: priced, approximate (the closest "
                    "kind, reported apart), pending, inexpressible; status: predicted, does not fit (harmony-sim's "
                    "reason), error, or the pricing status; sensitivity: the prediction with the machine's cpu_adam "
                    "bandwidth halved and doubled, and with every GPU's host link halved. docs/validation.md, "
                    "'Unseen published runs: predictions committed before comparison'."),
        ("produced_by", {"script": "scripts/validate-unseen.py", "harmony_sim": version, "git": git_head()}),
        ("counts", counts(preds)),
        ("predictions", preds),
    ])
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    print(table(preds))
    print(json.dumps(doc["counts"], indent=1))
    if args.check:
        with open(args.out) as f:
            old = json.load(f)
        want = {k: v for k, v in old["predictions"].items() if not args.only or k in args.only}
        got = json.loads(text)["predictions"]
        if want != got:
            diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            print(f"validate-unseen: {args.out} differs from what harmony-sim computes now at {diff}. It records "
                  "the predictions committed before comparison (and the commit that made them): regenerate it only "
                  "as a new, separately committed set of predictions (python3 scripts/validate-unseen.py), never "
                  "after looking at the measured values", file=sys.stderr)
            return 1
        print(f"validate-unseen: {args.out} is current ({len(got)} points)")
        return 0
    if args.only:
        print("validate-unseen: --only prices a subset; nothing written", file=sys.stderr)
        return 0
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
