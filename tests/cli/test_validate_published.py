#!/usr/bin/env python3
"""The published-systems table of docs/validation.md is what harmony-sim computes now: runs
scripts/validate-published.py --check against the built binary (exit 1 names the stale table), and checks that
every validation config is listed in configs/validation/published.json with a source, so that no config is
silently left out of the table."""
import json
import os
import subprocess
import sys

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
    for key in ("source", "hardware", "precision", "published", "shape", "batch"):
        if key not in e:
            failures.append(f"{e.get('name')}: no '{key}'")
run = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "validate-published.py"), "--sim", SIM,
                      "--check"], capture_output=True, text=True)
if run.returncode != 0:
    failures.append(f"validate-published.py --check exited {run.returncode}:\n{run.stderr}{run.stdout}")
for f in failures:
    print("FAIL:", f)
print(f"{len(entries)} entries checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
