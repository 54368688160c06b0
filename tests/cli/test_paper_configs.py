#!/usr/bin/env python3
"""The "reproduce the paper" config set (configs/paper/, issue 35 item 5) stays loadable: every config there runs
through `harmony-sim compare` (a short search: minibatch 4, microbatch 1, so the whole file takes seconds) naming
its model, with a feasible Harmony-PP plan and a row for every plan kind, dp-swap and pp-swap on demand
(search.swap) cost more than scheduled and name the timing, and every sweep file in configs/paper/sweeps/ is read and validated by `harmony-sim sweep` (a shard with no points: nothing is computed).
The full runs and the table they give are in docs/comparison.md ("The paper's own regime")."""
import glob
import json
import os
import sys
import tempfile

from clitest import PLAN_KINDS, ROOT, check, finish, runner

BIN = sys.argv[1]
POINTS = {"fig10.yaml": 2 * 3 * 6, "fig17.yaml": 4 * 4 * 6,   # models x minibatches or GPU counts x kinds
          "fig10_on_demand.yaml": 2 * 3 * 2, "fig17_on_demand.yaml": 4 * 4 * 2,  # dp-swap, pp-swap on demand
          "fig17_u1.yaml": 4 * 6, "fig17_u1_on_demand.yaml": 4 * 2}  # GPT-2 40B at u = 1: GPU counts x kinds
KINDS = set(PLAN_KINDS)
run = runner(BIN, timeout=120)

configs = sorted(glob.glob(os.path.join(ROOT, "configs/paper/*.yaml")))
check("configs/paper has the six model configs", len(configs) == 6, configs)
for path in configs:
    name = os.path.relpath(path, ROOT)
    stem = os.path.splitext(os.path.basename(path))[0].replace("_", "-")
    r = run("compare", name, "--quiet", "--format", "json", "--set", "plan.minibatch=4",
            "--set", "search.u_fwd=[1]", "--set", "search.u_bwd=[1]")
    check(f"{name}: compare exit 0", r.returncode == 0, r.stdout + r.stderr)
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    check(f"{name}: the model's name", doc.get("model_name") == stem, doc.get("model_name"))
    check(f"{name}: on the paper's testbed", doc.get("machine_name") == "paper-1080ti", doc.get("machine_name"))
    kinds = {k.get("plan_kind"): k for k in doc.get("results", [])}
    check(f"{name}: every plan kind", set(kinds) == KINDS, sorted(kinds))
    check(f"{name}: harmony-pp fits", kinds.get("harmony-pp", {}).get("feasible") is True, kinds.get("harmony-pp"))
    if path.endswith("gpt2_xl.yaml"):  # the paper's baselines as virtualized memory: never faster, the same bytes
        r = run("compare", name, "--quiet", "--format", "json", "--set", "plan.minibatch=4", "--set", "plan.gpus=4",
                "--set", "search.u_fwd=[1]", "--set", "search.u_bwd=[1]", "--set", "search.swap=on-demand")
        od = {k.get("plan_kind"): k for k in json.loads(r.stdout).get("results", [])} if r.returncode == 0 else {}
        r = run("compare", name, "--quiet", "--format", "json", "--set", "plan.minibatch=4", "--set", "plan.gpus=4",
                "--set", "search.u_fwd=[1]", "--set", "search.u_bwd=[1]")
        sc = {k.get("plan_kind"): k for k in json.loads(r.stdout).get("results", [])} if r.returncode == 0 else {}
        for kind in ("dp-swap", "pp-swap"):
            a, b = (od.get(kind) or {}).get("best") or {}, (sc.get(kind) or {}).get("best") or {}
            check(f"{name}: {kind} on demand names its timing",
                  a.get("swap_timing") == "on-demand" and b.get("swap_timing") == "scheduled", (a.get("swap_timing"),
                                                                                              b.get("swap_timing")))
            check(f"{name}: {kind} on demand is slower, same swap bytes",
                  a.get("iteration_time_s", 0) > b.get("iteration_time_s", 1e9) and
                  (a.get("activation_policy") != b.get("activation_policy") or
                   a.get("swap_in_bytes") == b.get("swap_in_bytes")), (a.get("iteration_time_s"),
                                                                     b.get("iteration_time_s")))
        r = run("compare", name, "--quiet", "--set", "plan.minibatch=4", "--set", "plan.gpus=4",
                "--set", "search.u_fwd=[1]", "--set", "search.u_bwd=[1]", "--set", "search.swap=on-demand")
        rows = [line for line in r.stdout.splitlines() if line.startswith(("dp-swap", "pp-swap", "zero-infinity"))]
        check(f"{name}: the table names the on-demand rows, only those",
              len(rows) == 3 and all(("on-demand swap" in x) == (not x.startswith("zero")) for x in rows), rows)
        check(f"{name}: other kinds have no swap timing", (od.get("zero-infinity") or {}).get("best", {}).get(
            "swap_timing", "missing") is None, od.get("zero-infinity"))

sweeps = sorted(glob.glob(os.path.join(ROOT, "configs/paper/sweeps/*.yaml")))
check("configs/paper/sweeps has the six sweep files", len(sweeps) == len(POINTS), sweeps)
with tempfile.TemporaryDirectory() as tmp:
    for i, path in enumerate(sweeps):
        name = os.path.relpath(path, ROOT)
        # Point p runs in shard p % N; no sweep here has 999 points, so shard 999/1000 computes none, but the
        # file, its base config and every grid key are read and checked first.
        r = run("sweep", name, "--out", os.path.join(tmp, str(i)), "--shard", "999/1000", "--quiet",
                "--format", "json")
        check(f"{name}: sweep file validates", r.returncode == 0, r.stdout + r.stderr)
        meta_path = os.path.join(tmp, str(i), "sweep.json")
        meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
        want = POINTS.get(os.path.basename(path))
        check(f"{name}: {want} points", meta.get("points") == want, meta.get("points"))
        on_demand = name.endswith("_on_demand.yaml")
        # the paper compared no ZeRO-Offload (stage 2), ZeRO-3 with only the optimizer offloaded, FSDP with CPU
        # offload, LoHan, ZeRO-2, FSDP, ZeRO-3 on the GPUs, GPU update over streamed state (host-stream) or in-memory run
        want_kinds = {"dp-swap", "pp-swap"} if on_demand else KINDS - {"lohan", "resident", "zero-offload", "fsdp",
                                                                        "zero3-opt-offload", "fsdp-offload", "zero2",
                                                                        "zero3", "host-stream"}
        check(f"{name}: the paper's baseline types and Harmony", set(meta.get("kinds", [])) == want_kinds,
              meta.get("kinds"))
        if on_demand:
            grid = {g.get("key"): g.get("values") for g in meta.get("grid", [])}
            check(f"{name}: a search.swap column of on-demand", grid.get("search.swap") == ["on-demand"], grid)

finish()
