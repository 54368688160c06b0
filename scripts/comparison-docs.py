#!/usr/bin/env python3
# Owns the generated parts of docs/comparison.md: regenerates each with the built harmony-sim and checks (or, with
# --fix, rewrites) what stands between its markers `<!-- comparison-docs:NAME begin -->` and `... end -->`:
#   compare   scripts/make-comparison.sh's compare tables (bundled profiles, paper-1080ti, native; < 1 s)
#   verdicts  configs/sweeps/gpt_1b_100b.yaml's sweep and scripts/sweep-verdicts.py (1,344 points)
#   paper     configs/paper/sweeps/fig10*.yaml and fig17*.yaml, configs/paper/table.py (the paper's regime)
#   paper-u1  configs/paper/sweeps/fig17_u1*.yaml and table.py (GPT-2 40B at the artifact's u = 1)
# Exit 1 when a part differs (the page states numbers the build no longer gives), 2 on bad use.
#   python3 scripts/comparison-docs.py [--build build] [--fix]
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "comparison.md")


def run(cmd):
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def sweep(sim, config, out):
    run([sim, "sweep", os.path.join(ROOT, config), "--out", out, "--quiet"])
    return os.path.join(out, "results.csv")


def generate(build, tmp):
    sim = os.path.join(os.path.abspath(build), "sim", "harmony-sim")
    if not os.access(sim, os.X_OK):
        print(f"comparison-docs: no harmony-sim at {sim}: build first (ninja -C {build})", file=sys.stderr)
        sys.exit(2)
    parts = {"compare": run(["bash", "scripts/make-comparison.sh", os.path.abspath(build)])}
    grid = os.path.join(tmp, "verdicts")
    sweep(sim, "configs/sweeps/gpt_1b_100b.yaml", grid)
    parts["verdicts"] = run([sys.executable, "scripts/sweep-verdicts.py", grid])
    paper = [sweep(sim, f"configs/paper/sweeps/{name}.yaml", os.path.join(tmp, name))
             for name in ("fig10", "fig17", "fig10_on_demand", "fig17_on_demand")]
    parts["paper"] = run([sys.executable, "configs/paper/table.py"] + paper)
    u1 = [sweep(sim, f"configs/paper/sweeps/{name}.yaml", os.path.join(tmp, name))
          for name in ("fig17_u1", "fig17_u1_on_demand")]
    parts["paper-u1"] = run([sys.executable, "configs/paper/table.py"] + u1)
    return parts


def main():
    ap = argparse.ArgumentParser(description="check (or --fix) the generated parts of docs/comparison.md")
    ap.add_argument("--build", default="build", help="the build folder holding sim/harmony-sim (default build)")
    ap.add_argument("--fix", action="store_true", help="rewrite the parts that differ")
    args = ap.parse_args()
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    with tempfile.TemporaryDirectory(prefix="comparison-docs-") as tmp:
        parts = generate(args.build, tmp)
    stale = []
    for name, text in parts.items():
        pat = re.compile(r"(<!-- comparison-docs:%s begin -->\n)(.*?)(<!-- comparison-docs:%s end -->)" %
                         (re.escape(name), re.escape(name)), re.S)
        m = pat.search(doc)
        if not m:
            print(f"comparison-docs: docs/comparison.md has no markers for '{name}'", file=sys.stderr)
            sys.exit(2)
        if m.group(2) != text:
            stale.append(name)
            doc = doc[:m.start(2)] + text + doc[m.end(2):]
    if stale and args.fix:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(doc)
        print(f"comparison-docs: rewrote {', '.join(stale)} in docs/comparison.md: read the prose around them")
        return 0
    if stale:
        print(f"comparison-docs: docs/comparison.md differs from this build in: {', '.join(stale)}; run "
              f"python3 scripts/comparison-docs.py --build {args.build} --fix and update the prose that cites them")
        return 1
    print(f"comparison-docs: {len(parts)} generated parts of docs/comparison.md current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
