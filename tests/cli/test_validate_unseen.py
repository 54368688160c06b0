#!/usr/bin/env python3
"""configs/validation/unseen/predictions.json (issue 35) is complete and is what harmony-sim computes now:
every point of points.json has exactly one record, with a known status, a number and its host-rate sensitivity
when predicted, and counts that add up; scripts/validate-unseen.py --check reproduces a cheap subset of the
committed predictions (one point of each measure, sweep, approximate and pending/inexpressible record) while
refusing to open measured.json; a copy with one predicted number changed must fail --check; --only with an unknown
point is a usage error (exit 2); docs/validation.md's comparison block is scripts/compare-unseen.py's output for the
committed files (an edited block fails). The whole file is checked by `python3 scripts/validate-unseen.py --check`
(about a minute: not run here)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SIM = os.path.abspath(sys.argv[1])
ROOT = os.path.abspath(os.environ.get("HARMONY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
UNSEEN = os.path.join(ROOT, "configs", "validation", "unseen")
SCRIPT = os.path.join(ROOT, "scripts", "validate-unseen.py")
SUBSET = ["sh-megatron-1.7b-v100", "sh-l2l-1.7b-v100", "ta-vitg-ao-offload-1x4070tis", "ps-ds-zero3-offload-10b-1xa100",
          "rl-pangu26b-zero3-offload-2xv100", "sh-stronghold-L16-v100", "tt-llama32-3b-compile-1xa100"]
STATUSES = {"predicted", "does not fit", "error", "pending", "inexpressible"}
PRICING = {"priced", "approximate", "pending", "inexpressible"}

failures = []
with open(os.path.join(UNSEEN, "points.json")) as f:
    point_ids = [p["id"] for p in json.load(f)["points"]]
with open(os.path.join(UNSEEN, "pricing.json")) as f:
    pricing = {e["id"]: e for e in json.load(f)["points"]}
with open(os.path.join(UNSEEN, "predictions.json")) as f:
    committed = json.load(f)
preds = committed["predictions"]
if sorted(preds) != sorted(point_ids) or sorted(pricing) != sorted(point_ids):
    failures.append(f"points, pricing and predictions disagree: {sorted(set(point_ids) ^ set(preds))}, "
                    f"{sorted(set(point_ids) ^ set(pricing))}")
tally = {}
for pid, r in preds.items():
    if r.get("status") not in STATUSES or r.get("pricing") not in PRICING:
        failures.append(f"{pid}: status {r.get('status')!r}, pricing {r.get('pricing')!r}")
        continue
    if pid in pricing and r["pricing"] != pricing[pid]["status"]:
        failures.append(f"{pid}: pricing {r['pricing']} in predictions.json, {pricing[pid]['status']} in pricing.json")
    if r["status"] == "predicted":
        if not isinstance(r.get("predicted"), float) or r["predicted"] <= 0 or "sensitivity" not in r:
            failures.append(f"{pid}: predicted without a positive number or a sensitivity: {r}")
        elif r["measure"] == "kind" and sorted(r["sensitivity"]) != ["cpu_adam_x0.5", "cpu_adam_x2", "h2d_x0.5"]:
            failures.append(f"{pid}: sensitivity {r['sensitivity']}")
    elif not r.get("reason"):
        failures.append(f"{pid}: {r['status']} without a reason")
    key = r["status"] if r["status"] != "predicted" else (
        "predicted" if r["pricing"] == "priced" else "predicted (approximate kind)")
    by = tally.setdefault(r["source"], {})
    by[key] = by.get(key, 0) + 1
if tally != committed["counts"]:
    failures.append(f"counts {committed['counts']} do not add up to the records {tally}")

# --check on the subset, with open() refusing measured.json for the whole run of the script.
GUARD = ("import builtins, runpy, sys\n"
         "_open = builtins.open\n"
         "def guarded(file, *a, **k):\n"
         "    if 'measured' in str(file):\n"
         "        raise SystemExit('validate-unseen opened ' + str(file))\n"
         "    return _open(file, *a, **k)\n"
         "builtins.open = guarded\n"
         "sys.argv = sys.argv[1:]\n"
         "runpy.run_path(sys.argv[0], run_name='__main__')\n")
only = [a for pid in SUBSET for a in ("--only", pid)]
run = subprocess.run([sys.executable, "-c", GUARD, SCRIPT, "--sim", SIM, "--check", "--jobs", "2"] + only,
                     capture_output=True, text=True)
if run.returncode != 0 or "is current" not in run.stdout:
    failures.append(f"--check on {SUBSET}: exit {run.returncode}\n{run.stderr[-2000:]}")

tmp = tempfile.mkdtemp()
try:
    stale = json.loads(json.dumps(committed))
    pid = "sh-l2l-1.7b-v100"
    stale["predictions"][pid]["predicted"] *= 1.01
    copy = os.path.join(tmp, "predictions.json")
    with open(copy, "w") as f:
        json.dump(stale, f)
    run = subprocess.run([sys.executable, SCRIPT, "--sim", SIM, "--check", "--out", copy, "--only", pid],
                         capture_output=True, text=True)
    if run.returncode != 1 or pid not in run.stderr:
        failures.append(f"--check on a changed prediction: exit {run.returncode} (expected 1), {run.stderr!r}")
    run = subprocess.run([sys.executable, SCRIPT, "--sim", SIM, "--only", "no-such-point"], capture_output=True,
                         text=True)
    if run.returncode != 2 or "no-such-point" not in run.stderr:
        failures.append(f"--only with an unknown point: exit {run.returncode} (expected 2), {run.stderr!r}")
    # Step (4): docs/validation.md's comparison block is what the committed predictions and measured values give,
    # and a block that says otherwise (one error changed) fails.
    COMPARE = os.path.join(ROOT, "scripts", "compare-unseen.py")
    doc = os.path.join(ROOT, "docs", "validation.md")
    run = subprocess.run([sys.executable, COMPARE, "--check-docs", doc], capture_output=True, text=True)
    if run.returncode != 0 or "is current" not in run.stdout:
        failures.append(f"compare-unseen --check-docs: exit {run.returncode}, {run.stderr!r}")
    with open(doc) as f:
        text = f.read()
    block = text[text.index("<!-- compare-unseen:begin"):text.index("<!-- compare-unseen:end")]
    row = next(line for line in block.splitlines() if line.startswith("| `sh-l2l-1.7b-v100` |"))
    error = re.search(r"\| ([+-]\d+%) \|", row).group(1)  # the row's first signed error, whatever the model says
    edited = os.path.join(tmp, "validation.md")
    with open(edited, "w") as f:
        f.write(text.replace(row, row.replace(f"| {error} |", "| +1% |" if error != "+1%" else "| +2% |", 1), 1))
    run = subprocess.run([sys.executable, COMPARE, "--check-docs", edited], capture_output=True, text=True)
    if run.returncode != 1 or "not what the committed predictions" not in run.stderr:
        failures.append(f"compare-unseen --check-docs on an edited block: exit {run.returncode} (expected 1)")
    # A sealed point (its prediction committed, its value kept apart) is left out and named; a predicted point with no
    # value that is not sealed, and a sealed point that has a value, are errors.
    with open(os.path.join(ROOT, "configs", "validation", "unseen", "measured.json")) as f:
        meas = json.load(f)
    some = sorted(meas["measured"])[0]
    value = meas["measured"].pop(some)
    ids = meas.get("sealed", {}).get("ids", []) + [some]  # beside any points sealed now
    variants = [("no value", dict(meas), 2, "has no value"),
                ("sealed", dict(meas, sealed={"ids": ids}), 0, f"Sealed: {len(ids)} points"),
                ("sealed with a value", dict(meas, measured=dict(meas["measured"], **{some: value}),
                                             sealed={"ids": ids}), 2, "are sealed and have measured values")]
    for name, content, want_rc, want_text in variants:
        path = os.path.join(tmp, "measured-" + name.replace(" ", "-") + ".json")
        with open(path, "w") as f:
            json.dump(content, f)
        run = subprocess.run([sys.executable, COMPARE, "--markdown", "--measured", path], capture_output=True,
                             text=True)
        if run.returncode != want_rc or want_text not in run.stdout + run.stderr:
            failures.append(f"compare-unseen with {name}: exit {run.returncode} (expected {want_rc}), "
                            f"{(run.stdout + run.stderr)[-300:]!r}")
    # A time metric must name the unit it is compared in (compare-unseen tells times from speeds by the unit's first
    # word): a prediction in seconds under a point's 'ms' unit was read as a speed, its error's sign flipped.
    import importlib.util
    spec = importlib.util.spec_from_file_location("validate_unseen", SCRIPT)
    vu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vu)
    for metric, unit, bad in [("seconds", "s per step", False), ("seconds", "ms per step", True),
                              ("milliseconds", "ms per step", False), ("milliseconds", "s per step", True),
                              ("tokens_per_s", "tokens/s (global)", False), ("samples_per_s", "ms per step", True),
                              ("epoch_seconds", "s (one epoch)", False)]:
        if (vu.unit_problem({"metric": metric}, unit) is not None) != bad:
            failures.append(f"unit_problem({metric}, {unit!r}) should {'' if bad else 'not '}be a problem")
    # A measured value marked implausible (measured.json) is shown in a group of its own, out of every other median.
    with open(os.path.join(ROOT, "configs", "validation", "unseen", "measured.json")) as f:
        meas = json.load(f)
    some = next(k for k, r in sorted(json.load(open(os.path.join(ROOT, "configs", "validation", "unseen",
                                                                  "predictions.json")))["predictions"].items())
                if r["status"] == "predicted" and not meas["measured"][k].get("implausible"))
    meas["measured"][some] = dict(meas["measured"][some], implausible="a test's reason")
    path = os.path.join(tmp, "measured-implausible.json")
    with open(path, "w") as f:
        json.dump(meas, f)
    run = subprocess.run([sys.executable, COMPARE, "--markdown", "--measured", path], capture_output=True, text=True)
    if run.returncode != 0 or f"Implausible value `{some}`: a test's reason" not in run.stdout \
            or "| **implausible value** | all |" not in run.stdout:
        failures.append(f"compare-unseen with an implausible value: exit {run.returncode}, {run.stderr[-300:]!r}")
    # Same-testbed ratios: two systems on one source's machine, GPUs, model and unit; a bias common to both cancels
    # (both 20% fast: ratio error 0), what one system adds does not; other testbeds and implausible values stay apart.
    spec = importlib.util.spec_from_file_location("compare_unseen", COMPARE)
    cu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cu)
    pts = {i: {"source": "s", "gpus": 1, "offloading": off, "metric": {"unit": "s"},
               "model": {"layers": 2, "hidden": 8, "seq_len": 4}} for i, off in
           [("a", False), ("b", True), ("c", True), ("d", True)]}
    pts["d"]["gpus"] = 2
    pri = {i: {"machine": "m"} for i in pts}
    rows_t = [{"id": "a", "group": "non-offloading", "error": 0.2}, {"id": "b", "group": "offloading", "error": 0.2},
              {"id": "c", "group": "offloading", "error": 0.5}, {"id": "d", "group": "offloading", "error": 0.9}]
    got = {r["id"]: (r["base"], round(r["error"], 9)) for r in cu.ratios(rows_t, pts, pri)}
    if got != {"b": ("a", 0.0), "c": ("a", 0.25)}:
        failures.append(f"compare-unseen ratios: {got}")
    # The host-rate bound: per offloading point, which cpu_adam variant predicts best, and the median of the best.
    rows_h = [{"group": "offloading", "error": 0.4, "sens": {"cpu_adam_x0.5": 0.1, "cpu_adam_x2": 0.8}},
              {"group": "offloading", "error": -0.3, "sens": {"cpu_adam_x0.5": -0.5, "cpu_adam_x2": -0.1}},
              {"group": "offloading", "error": 0.2, "sens": {"cpu_adam_x0.5": 0.21, "cpu_adam_x2": 0.19}},
              {"group": "non-offloading", "error": 0.9, "sens": {}}]
    n_h, c_h, med_h, within_h = cu.host_rate_bound(rows_h)
    if (n_h, c_h, round(med_h, 9), within_h) != (3, {"halved": 1, "doubled": 1, "neither": 0, "insensitive": 1}, 0.1,
                                                   3):
        failures.append(f"compare-unseen host_rate_bound: {(n_h, c_h, med_h, within_h)}")
    # A second, stale copy of the block after the current one (docs/validation.md carried one for a session) fails
    # even though the first block is current.
    doubled = os.path.join(tmp, "doubled.md")
    with open(doubled, "w") as f:
        f.write(text + "\n" + block + "<!-- compare-unseen:end -->\n")
    run = subprocess.run([sys.executable, COMPARE, "--check-docs", doubled], capture_output=True, text=True)
    if run.returncode != 1 or "exactly one" not in run.stderr:
        failures.append(f"compare-unseen --check-docs with two blocks: exit {run.returncode} (expected 1)")
    # The same paste is refused by the doc check too: its sections' headings repeat under the same parent.
    pasted = os.path.join(tmp, "pasted.md")
    with open(pasted, "w") as f:
        f.write(text + "\n## Unseen published runs: predictions committed before comparison\n\nagain\n")
    links = os.path.join(ROOT, "scripts", "check-doc-links.py")
    run = subprocess.run([sys.executable, links, pasted], capture_output=True, text=True)
    if run.returncode != 1 or "repeats line" not in run.stdout:
        failures.append(f"check-doc-links on a pasted section: exit {run.returncode} (expected 1), {run.stdout!r}")
    run = subprocess.run([sys.executable, links, doc], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"check-doc-links on docs/validation.md: exit {run.returncode}, {run.stdout!r}")
    summary = subprocess.run([sys.executable, COMPARE], capture_output=True, text=True)
    if summary.returncode != 0 or "median |error|" not in summary.stdout:
        failures.append(f"compare-unseen: exit {summary.returncode}, {summary.stderr!r}")
finally:
    shutil.rmtree(tmp)
for f in failures:
    print("FAIL:", f)
print(f"{len(preds)} predictions checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
