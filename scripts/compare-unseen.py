#!/usr/bin/env python3
# Step (4) of docs/validation.md's unseen-runs procedure (issue 35): compares the committed predictions
# (configs/validation/unseen/predictions.json) with the measured values (measured.json), point by point and per
# source, offloading and non-offloading apart, approximate kinds and the non-independent source apart, with each
# prediction's host-rate sensitivity. It prices nothing: the predictions stay what was committed before comparison.
#   python3 scripts/compare-unseen.py [--markdown] [--check-docs docs/validation.md] [--measured FILE]
import argparse
import importlib.util
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNSEEN = os.path.join(ROOT, "configs", "validation", "unseen")
NOT_INDEPENDENT = {"lohan-artifact-mgpu"}  # sources.md, "Independence": the LoHan points' artifact and testbed
BEGIN = "<!-- compare-unseen:begin (scripts/compare-unseen.py --markdown; do not edit by hand) -->"
END = "<!-- compare-unseen:end -->"


# The time units (a unit's first word) validate-unseen.py's metrics are checked against: one list for both scripts.
_spec = importlib.util.spec_from_file_location("validate_unseen", os.path.join(ROOT, "scripts", "validate-unseen.py"))
_vu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_vu)
TIME_WORDS = {w for words in _vu.TIME_UNITS.values() for w in words}


def is_time(unit):
    return unit.split()[0] in TIME_WORDS


def speed_error(unit, predicted, measured):
    """predicted speed / measured speed - 1: positive when harmony-sim predicts the run faster than it was."""
    return measured / predicted - 1.0 if is_time(unit) else predicted / measured - 1.0


def group_of(rec):
    if rec["source"] in NOT_INDEPENDENT:
        return "not independent"
    if rec["pricing"] == "approximate":
        return "approximate kind"
    return "offloading" if rec["offloading"] else "non-offloading"


def compare(preds, measured):
    rows = []
    for pid, r in preds.items():
        if r["status"] != "predicted":
            continue
        m = measured[pid]["value"]
        err = speed_error(r["unit"], r["predicted"], m)
        sens = r["sensitivity"] if isinstance(r["sensitivity"], dict) else {}
        sens_err = {k: speed_error(r["unit"], v, m) for k, v in sens.items() if isinstance(v, float)}
        kind = r.get("plan_kind", "compute")
        # a measured value no GPU could give (measured.json "implausible": why, e.g. above the datasheet peak by the
        # model's own FLOPs) is shown apart and in no other group's median
        group = "implausible value" if measured[pid].get("implausible") else group_of(r)
        rows.append({"id": pid, "source": r["source"], "group": group, "kind": kind, "gpus": r["gpus"],
                     "unit": r["unit"], "predicted": r["predicted"], "measured": m, "error": err, "sens": sens_err,
                     "implausible": measured[pid].get("implausible")})
    return rows


def summary(rows, key):
    out = {}
    for row in rows:
        out.setdefault(key(row), []).append(row["error"])
    return {k: (len(v), statistics.median(abs(e) for e in v), statistics.median(v), max(abs(e) for e in v))
            for k, v in sorted(out.items())}


def host_rate_bound(rows):
    """How much of the offloading group's error the unknown host CPU rate can explain: for each point, which of
    cpu_adam halved, as assumed, or doubled predicts it best (a move under 2 points counts as insensitive), and the
    median |error| if each point had its best of the three. An oracle's bound, not a prediction: no source gives
    the rate for these testbeds (docs/machines.md, "Host rates: measured or assumed")."""
    off = [r for r in rows if r["group"] == "offloading"]
    if not off:
        return None
    count = {"halved": 0, "doubled": 0, "neither": 0, "insensitive": 0}
    best = []
    for r in off:
        e = abs(r["error"])
        h = abs(r["sens"].get("cpu_adam_x0.5", r["error"]))
        d = abs(r["sens"].get("cpu_adam_x2", r["error"]))
        if abs(h - e) < 0.02 and abs(d - e) < 0.02:
            count["insensitive"] += 1
        elif h < e and h <= d:
            count["halved"] += 1
        elif d < e:
            count["doubled"] += 1
        else:
            count["neither"] += 1
        best.append(min(e, h, d))
    return len(off), count, statistics.median(best), sum(1 for b in best if b <= 0.35)


def testbed_key(pid, points, pricing):
    """Points of one source on the same machine, GPU count and model shape, in the same unit: systems side by side."""
    p, e = points[pid], pricing[pid]
    m = p["model"]
    return (p["source"], e.get("machine"), p["gpus"], p["metric"]["unit"], m.get("layers"), m.get("hidden"),
            m.get("seq_len"))


def ratios(rows, points, pricing):
    """Issue 35's third target: the ratio between two systems run on the same testbed, predicted against measured.
    Each testbed's points (testbed_key; implausible values and the not-independent source left out) are set against its first (non-offloaded before
    offloaded, then by id): error = predicted speed ratio / measured speed ratio - 1. A source's bias common to both
    systems (its trainer's overhead, its machine's unstated rates) cancels in the ratio; what each system adds does not."""
    groups = {}
    for r in rows:
        if r["group"] not in ("implausible value", "not independent"):
            groups.setdefault(testbed_key(r["id"], points, pricing), []).append(r)
    out = []
    for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        members = sorted(groups[key], key=lambda r: (points[r["id"]]["offloading"], r["id"]))
        base = members[0]
        for r in members[1:]:
            # (1 + error) is predicted speed / measured speed for each point; the ratio's error divides them
            err = (1.0 + r["error"]) / (1.0 + base["error"]) - 1.0
            out.append({"source": key[0], "id": r["id"], "base": base["id"], "error": err})
    return out


def pct(x):
    return f"{100 * x:+.0f}%"


def markdown(rows, preds, ratio_rows=()):
    lines = ["Speed error = predicted speed / measured speed − 1 (positive: harmony-sim predicts the run faster than "
             "it was). Medians over the points of each group; `n` counts predicted points only.", "",
             "| group | source | n | median \\|error\\| | median error | worst \\|error\\| |",
             "|---|---|---|---|---|---|"]
    groups = ("non-offloading", "offloading", "approximate kind", "not independent", "implausible value")
    for g in groups:
        in_g = [r for r in rows if r["group"] == g]
        for src, (n, med_abs, med, worst) in summary(in_g, lambda r: r["source"]).items():
            lines.append(f"| {g} | `{src}` | {n} | {100 * med_abs:.0f}% | {pct(med)} | {100 * worst:.0f}% |")
        if in_g:
            n, med_abs, med, worst = summary(in_g, lambda r: "all")["all"]
            lines.append(f"| **{g}** | all | **{n}** | **{100 * med_abs:.0f}%** | {pct(med)} | "
                         f"{100 * worst:.0f}% |")
    not_pred = sum(1 for r in preds.values() if r["status"] != "predicted")
    lines += ["", f"Not compared: {not_pred} of {len(preds)} points (pending, inexpressible or not fitting; "
              "`predictions.json` says why for each).", "",
              "| point | kind | GPUs | predicted | measured | unit | error | cpu_adam ÷2 | cpu_adam ×2 | PCIe ÷2 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (groups.index(r["group"]), r["source"], r["id"])):
        s = [pct(r["sens"][k]) if k in r["sens"] else "–" for k in ("cpu_adam_x0.5", "cpu_adam_x2", "h2d_x0.5")]
        lines.append(f"| `{r['id']}` | {r['kind']} | {r['gpus']} | {r['predicted']:.4g} | {r['measured']:.4g} | "
                     f"{r['unit']} | {pct(r['error'])} | {' | '.join(s)} |")
    lines += [f"\nImplausible value `{r['id']}`: {r['implausible']}" for r in rows if r["group"] == "implausible value"]
    bound = host_rate_bound(rows)
    if bound:
        n, c, med, within35 = bound
        lines += ["", f"The host CPU rate (offloading group, n {n}): {c['halved']} points are predicted better with every "
                      f"machine's `cpu_adam` halved, {c['doubled']} with it doubled, {c['neither']} with neither, "
                      f"{c['insensitive']} move by under 2 points. With the best of the three for each point (an "
                      f"oracle's bound, not a prediction) the median |error| would be {100 * med:.0f}% and {within35} "
                      f"of {n} within 35%."]
    if ratio_rows:
        errs = [abs(r["error"]) for r in ratio_rows]
        within = sum(1 for e in errs if e <= 0.25)
        lines += ["", f"Ratios between systems on the same testbed (same source, machine, GPU count, model and unit; "
                      f"each set against the testbed's first point; the not-independent source left out): {len(ratio_rows)} ratios, median |error| "
                      f"{100 * statistics.median(errs):.0f}%, {within} within 25%, worst {100 * max(errs):.0f}%.", "",
                  "| source | point | against | ratio error |", "|---|---|---|---|"]
        lines += [f"| `{r['source']}` | `{r['id']}` | `{r['base']}` | {pct(r['error'])} |" for r in ratio_rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description="compare the committed unseen-run predictions with the measured values")
    ap.add_argument("--markdown", action="store_true", help="print docs/validation.md's comparison block")
    ap.add_argument("--check-docs", metavar="FILE",
                    help="exit 1 unless FILE's block between the compare-unseen markers is this script's --markdown")
    ap.add_argument("--measured", metavar="FILE", default=os.path.join(UNSEEN, "measured.json"),
                    help="the measured values (default: configs/validation/unseen/measured.json)")
    args = ap.parse_args()
    with open(os.path.join(UNSEEN, "predictions.json")) as f:
        preds = json.load(f)["predictions"]
    with open(args.measured) as f:
        doc_measured = json.load(f)
    measured = doc_measured["measured"]
    # Points whose predictions are committed while their measured values are still kept apart (docs/validation.md,
    # "Procedure"): listed by id in measured.json's "sealed"; they are left out of the comparison until the values
    # come in, and a sealed point with a value, or one that is not predicted, is an error.
    sealed = set(doc_measured.get("sealed", {}).get("ids", []))
    both = sorted(sealed & set(measured))
    if both:
        print(f"compare-unseen: {both} are sealed and have measured values; take them out of measured.json's "
              "sealed list", file=sys.stderr)
        return 2
    unknown = sorted(sealed - set(preds))
    if unknown:
        print(f"compare-unseen: measured.json seals {unknown}, which predictions.json does not have", file=sys.stderr)
        return 2
    missing = sorted(set(preds) - set(measured) - sealed)
    if missing:
        print(f"compare-unseen: measured.json has no value for {missing}", file=sys.stderr)
        return 2
    preds = {k: v for k, v in preds.items() if k not in sealed}
    rows = compare(preds, measured)
    with open(os.path.join(UNSEEN, "points.json")) as f:
        points = {p["id"]: p for p in json.load(f)["points"]}
    with open(os.path.join(UNSEEN, "pricing.json")) as f:
        pricing = {e["id"]: e for e in json.load(f)["points"]}
    ratio_rows = ratios(rows, points, pricing)
    text = markdown(rows, preds, ratio_rows)
    if sealed:
        text += (f"\n\nSealed: {len(sealed)} points are predicted and committed, their measured values not yet opened "
                 f"(measured.json \"sealed\"): {', '.join(f'`{i}`' for i in sorted(sealed))}.")
    if args.check_docs:
        with open(args.check_docs) as f:
            doc = f.read()
        if BEGIN not in doc or END not in doc:
            print(f"compare-unseen: {args.check_docs} has no compare-unseen block (markers {BEGIN!r} ... {END!r})",
                  file=sys.stderr)
            return 2
        if doc.count(BEGIN) != 1 or doc.count(END) != 1:
            print(f"compare-unseen: {args.check_docs} has {doc.count(BEGIN)} begin and {doc.count(END)} end markers; "
                  "keep exactly one compare-unseen block", file=sys.stderr)
            return 1
        block = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
        if block != text:
            print(f"compare-unseen: {args.check_docs}'s comparison is not what the committed predictions and "
                  "measured values give; replace the block with `python3 scripts/compare-unseen.py --markdown`",
                  file=sys.stderr)
            return 1
        print(f"compare-unseen: {args.check_docs} is current ({len(rows)} points compared)")
        return 0
    if args.markdown:
        print(BEGIN)
        print(text)
        print(END)
        return 0
    print(f"{'point':44} {'group':17} {'kind':14} {'predicted':>10} {'measured':>10} {'error':>7}")
    for r in rows:
        print(f"{r['id']:44} {r['group']:17} {r['kind']:14} {r['predicted']:10.4g} {r['measured']:10.4g} "
              f"{pct(r['error']):>7}")
    print()
    for g, (n, med_abs, med, worst) in summary(rows, lambda r: r["group"]).items():
        print(f"{g:17} n={n:3}  median |error| {100 * med_abs:4.0f}%  median {pct(med):>5}  worst {100 * worst:.0f}%")
    if ratio_rows:
        errs = [abs(r["error"]) for r in ratio_rows]
        print(f"same-testbed ratios n={len(errs)}  median |error| {100 * statistics.median(errs):.0f}%  within 25%: "
              f"{sum(1 for e in errs if e <= 0.25)}  worst {100 * max(errs):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
