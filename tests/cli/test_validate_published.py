#!/usr/bin/env python3
"""The published-systems table of docs/validation.md is what harmony-sim computes now: runs
scripts/validate-published.py --check against the built binary (exit 1 names the stale table), and checks that
every validation config is listed in configs/validation/published.json with a source, so that no config is
silently left out of the table; a copy of the doc with one predicted number changed must fail --check, and
regenerating that copy must restore the committed table byte for byte."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

SIM = os.path.abspath(sys.argv[1])
ROOT = os.path.abspath(os.environ.get("HARMONY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
VALID = os.path.join(ROOT, "configs", "validation")

with open(os.path.join(VALID, "published.json")) as f:
    pub = json.load(f)
entries = pub["calibration"] + pub["points"]
listed = {e["config"] for e in entries}
on_disk = {n for n in os.listdir(VALID) if n.endswith(".yaml")}
on_disk |= {"calibration/" + n for n in os.listdir(os.path.join(VALID, "calibration")) if n.endswith(".yaml")}
failures = []
if listed != on_disk:
    failures.append(f"configs/validation: not in published.json: {sorted(on_disk - listed)}; "
                    f"listed but missing: {sorted(listed - on_disk)}")
for e in entries:
    for key in ("source", "source_group", "preset", "hardware", "precision", "published", "shape", "batch"):
        if key not in e:
            failures.append(f"{e.get('name')}: no '{key}'")
for e in pub["points"]:
    if not isinstance(e.get("offloading"), bool):
        failures.append(f"{e.get('name')}: 'offloading' must be true or false (the summary reports the two apart)")
    with open(os.path.join(VALID, e["config"])) as f:
        if f"preset: {e.get('preset')}" not in f.read():
            failures.append(f"{e['name']}: preset {e.get('preset')!r} is not the one its config {e['config']} names")

# A source that calibrates a preset validates nothing on it (issue 35): such a point is "not independent", reported
# apart from the headline; the same source on another preset, or another source on that preset, is a validation point.
spec = importlib.util.spec_from_file_location("validate_published", os.path.join(ROOT, "scripts", "validate-published.py"))
vp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vp)
cal = {"name": "c", "preset": "p1", "source_group": "g"}
synthetic = {"calibration": [cal], "points": []}
for point, want in (({"preset": "p1", "source_group": "g"}, "not independent"), ({"preset": "p1", "source_group": "h"}, ""),
                    ({"preset": "p2", "source_group": "g"}, ""), ({"preset": "p1", "source_group": "g", "pending": "x"}, "pending"),
                    (cal, "calibration")):
    got = vp.role_of(point, synthetic)
    if got != want:
        failures.append(f"role_of({point}) = {got!r}, expected {want!r}")
with open(os.path.join(ROOT, "docs", "validation.md")) as f:
    doc = f.read()
for e in pub["points"]:
    if vp.role_of(e, pub) == "not independent" and f"| `{e['name']}` (not independent) |" not in doc:
        failures.append(f"docs/validation.md does not mark {e['name']} (its preset's calibration source) not independent")
SCRIPT = [sys.executable, os.path.join(ROOT, "scripts", "validate-published.py"), "--sim", SIM]
DOC = os.path.join(ROOT, "docs", "validation.md")
run = subprocess.run(SCRIPT + ["--check"], capture_output=True, text=True)
if run.returncode != 0:
    failures.append(f"validate-published.py --check exited {run.returncode}:\n{run.stderr}{run.stdout}")
# A stale copy: the first predicted TFLOP/s of the ZeRO-Offload row changed by one digit.
with open(DOC) as f:
    committed = f.read()
row = next((line for line in committed.splitlines() if line.startswith("| `zero-offload-10b-v100`")), None)
if row is None:
    failures.append("docs/validation.md has no zero-offload-10b-v100 row")
else:
    cells = row.split(" | ")
    pred = cells[5]  # "39.2 (22.228 s)"
    stale_pred = ("1" if pred[0] != "1" else "2") + pred[1:]
    stale = committed.replace(row, row.replace(pred, stale_pred, 1), 1)
    tmp = tempfile.mkdtemp()
    try:
        copy = os.path.join(tmp, "validation.md")
        with open(copy, "w") as f:
            f.write(stale)
        run = subprocess.run(SCRIPT + ["--check", "--doc", copy], capture_output=True, text=True)
        if run.returncode != 1 or "not what harmony-sim computes now" not in run.stderr:
            failures.append(f"--check on a stale table: exit {run.returncode} (expected 1), stderr {run.stderr!r}")
        run = subprocess.run(SCRIPT + ["--doc", copy], capture_output=True, text=True)
        with open(copy) as f:
            regenerated = f.read()
        if run.returncode != 0 or regenerated != committed:
            failures.append(f"regenerating the stale copy did not restore the committed doc (exit {run.returncode})")
    finally:
        shutil.rmtree(tmp)
for f in failures:
    print("FAIL:", f)
print(f"{len(entries)} entries checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
