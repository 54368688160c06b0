#!/usr/bin/env python3
"""End-to-end tests of `harmony-sim sweep` and `harmony-sim merge`: the bundled example's columns and rows
(infeasible and invalid points with reasons), identical files for 1 and 2 threads, SIGKILL mid-run then
rerun = the uninterrupted files, shards 0/3 1/3 2/3 merged = the unsharded files, a changed sweep refused on
resume, SIGINT/SIGTERM/SIGHUP (exit 128 + the signal, what was saved), broken rows refused naming --repair and
repaired by it, bad sweep files (exit 2, file:line:column, a hint); an edited profile recomputed on rerun, two sweeps on
one --out (the second exits 2 naming the first), a huge grid refused fast unless --allow-large-grid (then it
streams in little memory); the progress display shared with search and compare."""
import csv
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from clitest import PLAN_KINDS, ROOT, SANITIZED, check, default_signals, finish, runner, write
# a sweep without kinds: runs every kind but the in-memory ceiling (resident)
SWEEP_KINDS = len([k for k in PLAN_KINDS if k != "resident"])

BIN = sys.argv[1]
EXAMPLE = os.path.join(ROOT, "configs/sweeps/example.yaml")
BASE = os.path.join(ROOT, "configs/sweeps/example_base.yaml")
run = runner(BIN)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def same_files(a, b, names=("results.csv", "results.jsonl", "sweep.json")):
    return all(read(os.path.join(a, n)) == read(os.path.join(b, n)) for n in names)


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "example")
    r = run("sweep", EXAMPLE, "--out", out)
    check("example exit 0", r.returncode == 0, r.stdout + r.stderr)
    check("example summary", "96 points" in r.stdout, r.stdout)
    check("progress on stderr", "points/s" in r.stderr and "ETA" in r.stderr, r.stderr)
    rows = list(csv.DictReader(open(os.path.join(out, "results.csv"), newline="")))
    lines = [json.loads(x) for x in open(os.path.join(out, "results.jsonl"))]
    meta = json.load(open(os.path.join(out, "sweep.json")))
    check("example 96 rows", len(rows) == 96 and len(lines) == 96, (len(rows), len(lines)))
    check("sweep.json points", meta["points"] == 96 and meta["shard"] == {"index": 0, "count": 1}, meta)
    cols = meta["columns"]
    check("csv header = columns", list(rows[0].keys()) == cols, (list(rows[0].keys()), cols))
    check("jsonl keys = schema_version + columns", all(list(x.keys()) == ["schema_version"] + cols for x in lines),
          list(lines[0].keys()))
    for key in ["point", "id", "model.profile", "machine", "plan.gpus", "plan_kind", "status", "feasible", "reason",
                "iteration_time_s", "throughput_samples_per_s", "u_fwd", "u_bwd", "packs_fwd", "packs_bwd",
                "activation_policy", "offload",
                "swap_in_bytes", "swap_out_bytes", "p2p_bytes", "collective_bytes", "peak_memory_bytes",
                "gpu_capacity_bytes", "fits", "excess_bytes", "host_memory_bytes", "time_to_train_s",
                "price_per_hour", "cost"]:
        check(f"column {key}", key in cols, cols)
    check("points in order", [x["point"] for x in lines] == list(range(96)), [x["point"] for x in lines][:10])
    check("kinds innermost", [x["plan_kind"] for x in lines[:6]] ==
          ["harmony-pp", "harmony-dp", "dp-swap", "pp-swap", "zero-infinity", "l2l"], lines[:6])
    ok = [x for x in lines if x["status"] == "ok"]
    check("some ok", len(ok) > 40, len(ok))
    tiers = {"harmony-pp", "harmony-dp", "zero-infinity", "lohan"}
    check("ok rows name their activation policy and (kinds with tiers) their offload tier",
          all(x["activation_policy"] in ("checkpoint", "keep") and
              (x["offload"] in ("cpu", "nvme") if x["plan_kind"] in tiers else x["offload"] is None) for x in ok),
          [(x["plan_kind"], x["activation_policy"], x["offload"]) for x in ok][:8])
    check("Harmony rows recompute", all(x["activation_policy"] == "checkpoint" for x in ok
                                        if x["plan_kind"].startswith("harmony")), "")
    for x in ok:
        check(f"ok row {x['point']} metrics", x["feasible"] is True and x["iteration_time_s"] > 0 and
              x["throughput_samples_per_s"] > 0 and x["reason"] is None and x["time_to_train_s"] > 0 and
              isinstance(x["packs_bwd"], list) and x["fits"] is (x["peak_memory_bytes"] <= x["gpu_capacity_bytes"])
              and (x["excess_bytes"] is None) == x["fits"], x)
    invalid = [x for x in lines if x["status"] == "invalid"]
    check("rtx4090-4x N=8 invalid", len(invalid) == 12 and all(x["plan.gpus"] == 8 for x in invalid),
          [(x["point"], x["reason"]) for x in invalid])
    check("invalid reason", all("exceeds machine.gpus = 4" in x["reason"] for x in invalid), invalid[:1])
    check("invalid rows: no metrics", all(x["iteration_time_s"] is None and x["feasible"] is False
                                          for x in invalid), invalid[:1])
    priced = [x for x in ok if x["machine_name"] == "rtx4090-4x"]
    check("cost on priced machine", priced and all(
        abs(x["cost"] - x["time_to_train_s"] / 3600 * 2.4) <= 1e-9 * x["cost"] for x in priced), priced[:1])
    preset_priced = [x for x in ok if x["machine_name"] == "paper-1080ti"]  # the preset's price_per_hour: 1.20
    check("cost at the preset's price", preset_priced and all(
        x["price_per_hour"] == 1.2 and abs(x["cost"] - x["time_to_train_s"] / 3600 * 1.2) <= 1e-9 * x["cost"]
        for x in preset_priced), preset_priced[:1])
    check("time to train", all(x["time_to_train_s"] == x["iterations"] * x["iteration_time_s"] and
                               x["iterations"] == -(-1000000 // x["minibatch"]) for x in ok), ok[:1])

    # --- thread counts give the same bytes
    t1 = os.path.join(tmp, "t1")
    r = run("sweep", EXAMPLE, "--out", t1, "--threads", "1", "--quiet")
    check("threads 1 exit 0", r.returncode == 0 and r.stderr == "", r.stderr)
    t2 = os.path.join(tmp, "t2")
    r = run("sweep", EXAMPLE, "--out", t2, "--threads", "2", "--quiet")
    check("threads 1 = threads 2 = default", same_files(t1, t2) and same_files(t1, out), "files differ")

    # --- rerunning a finished sweep computes nothing and leaves the bytes
    r = run("sweep", EXAMPLE, "--out", t1, "--quiet")
    check("rerun finished", r.returncode == 0 and "0 computed" in r.stdout and "96 from an earlier run" in r.stdout,
          r.stdout)
    check("rerun totals", "96 points, 96 done" in r.stdout and "ok 84" in r.stdout and "invalid 12" in r.stdout,
          r.stdout)
    check("rerun same bytes", same_files(t1, out), "")

    # --- broken rows in the middle (a cut JSON line, a cut CSV line, a repeated row, a lost CSV row): the sweep
    # refuses to resume and names --repair, as the report does; --repair keeps every good row, computes the broken
    # ones again, and the files end as an uninterrupted run's
    broken = os.path.join(tmp, "broken")
    shutil.copytree(out, broken)
    jl = open(os.path.join(broken, "results.jsonl")).read().splitlines(keepends=True)
    jl[3] = jl[3][: len(jl[3]) // 2] + "\n"          # point 3: not JSON
    jl.insert(40, jl[39])                            # point 39 twice
    open(os.path.join(broken, "results.jsonl"), "w").writelines(jl)
    cl = open(os.path.join(broken, "results.csv")).read().splitlines(keepends=True)
    cl[11] = cl[11][: len(cl[11]) // 2] + "\n"       # point 10: a CSV row missing columns
    del cl[61]                                       # point 60: no CSV row
    open(os.path.join(broken, "results.csv"), "w").writelines(cl)
    r = run("sweep", EXAMPLE, "--out", broken, "--quiet")
    check("broken row: exit 2 naming the line and --repair", r.returncode == 2 and
          os.path.join(broken, "results.jsonl") + ":4" in r.stderr and "--repair" in r.stderr, r.stderr)
    r = run("report", broken, "--out", os.path.join(tmp, "broken.html"))
    check("broken row: report names the same recovery", r.returncode == 2 and
          f"--out {broken} --repair" in r.stderr, r.stderr)
    r = run("sweep", EXAMPLE, "--out", broken, "--quiet", "--repair")
    check("--repair: exit 0", r.returncode == 0, r.stdout + r.stderr)
    check("--repair: only the broken points computed", "96 points, 96 done (3 computed" in r.stdout and
          "93 from an earlier run" in r.stdout, r.stdout)
    check("--repair: names the lines it dropped", "repaired: 3 broken lines dropped" in r.stdout and
          os.path.join(broken, "results.csv") + ":12" in r.stdout and
          os.path.join(broken, "results.jsonl") + ":41" in r.stdout, r.stdout)
    check("--repair: = an uninterrupted run", same_files(broken, out), "files differ")
    r = run("sweep", EXAMPLE, "--out", broken, "--quiet")
    check("after --repair: a plain resume computes nothing", r.returncode == 0 and "0 computed" in r.stdout, r.stdout)
    csv_path = os.path.join(broken, "results.csv")
    text = open(csv_path).read()
    open(csv_path, "w").write(text.replace("point,id,", "pont,id,", 1))  # a damaged header
    r = run("sweep", EXAMPLE, "--out", broken, "--quiet", "--repair")
    check("--repair of a damaged header: every row kept, rewritten", r.returncode == 0 and "0 computed" in r.stdout
          and f"repaired: 1 broken line dropped ({csv_path}:1)" in r.stdout and same_files(broken, out), r.stdout)

    # --- a slower sweep (native cost model, every packing method), killed mid-run and rerun. Its points are
    # computed ~7 times below (full, killed and resumed, 3 shards, two writers): under the sanitizers
    # (HARMONY_SANITIZED) N = 1, 2 only (56 points, still > the 24 rows the kills wait for), the same checks.
    SLOW_GPUS = "[1, 2]" if SANITIZED else "[1, 2, 3, 4]"
    slow = write(os.path.join(tmp, "slow.yaml"), f"""base: {BASE}
set:
  cost_model: native
  search.pack_counts: minimum            # the paper's pack counts: this test is about the sweep, not the search
  search.packing_fwd: [greedy_reverse_addx, balanced_addx, reuse, balanced_time]
  search.packing_bwd: [greedy_reverse_addx, balanced_addx, balanced_time]
grid:
  model.profile: [../profiles/bert_large.json, ../profiles/gpt2_medium.json]
  plan.minibatch: [32, 64]
  plan.gpus: {SLOW_GPUS}
budget: {{tokens: 3e9, seq_len: 512}}
""")
    full = os.path.join(tmp, "slow_full")
    r = run("sweep", slow, "--out", full, "--threads", "2", "--quiet")
    check("slow exit 0", r.returncode == 0, r.stdout + r.stderr)
    killed = os.path.join(tmp, "slow_killed")
    # 8 or 16 points x the sweep's default kinds (no kinds: every kind but the in-memory ceiling, resident)
    total = SWEEP_KINDS * (8 if SANITIZED else 16)
    kills = 0
    # stop after a few rows (SIGINT, SIGTERM, SIGHUP: finish the point in flight, say what was saved, exit 128 +
    # the signal; then SIGKILL), rerun; resumes each time
    for attempt, sig in enumerate([signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]):
        as_json = ["--format", "json"] if sig == signal.SIGHUP else []
        p = subprocess.Popen([BIN, "sweep", slow, "--out", killed, "--threads", "1", "--quiet", *as_json], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
        jl = os.path.join(killed, "results.jsonl")
        start = time.time()
        # six rows of this run's own: rows an earlier attempt wrote past its stop are there before this run has
        # installed its handlers, and a signal sent then would meet the default action (killed, no message)
        target = (read(jl).count(b"\n") if os.path.exists(jl) else 0) + 6
        sent = False
        while p.poll() is None and time.time() - start < 120:
            if os.path.exists(jl) and read(jl).count(b"\n") >= target:
                p.send_signal(sig)
                sent = True
                kills += 1
                break
            time.sleep(0.005)
        pout, perr = p.communicate()
        if sent and sig != signal.SIGKILL and p.returncode != 0:
            saved = read(jl).count(b"\n")
            check(f"{sig.name}: exit {128 + sig}", p.returncode == 128 + sig, (p.returncode, pout, perr))
            check(f"{sig.name}: says what was saved and how to resume", f"interrupted by {sig.name}" in perr and
                  f"the {saved} rows are saved in {killed}/results.csv" in perr and
                  "rerun the same command to resume" in perr, perr)
            if as_json:
                doc = json.loads(pout) if pout.startswith("{") else {}
                check(f"{sig.name}: the JSON summary names it", doc.get("interrupted") is True and
                      doc.get("signal") == sig.name and doc.get("done") == saved, pout)
    n = read(os.path.join(killed, "results.jsonl")).count(b"\n")
    check("killed mid-run", kills > 0 and n < total, (kills, n))
    # simulate a kill in the middle of a write: a partial last line
    with open(os.path.join(killed, "results.jsonl"), "ab") as f:
        f.write(b'{"point":9999,"id":"trunc')
    r = run("sweep", slow, "--out", killed, "--threads", "2", "--quiet")
    check("resume exit 0", r.returncode == 0, r.stdout + r.stderr)
    m = [ln for ln in r.stdout.splitlines() if "from an earlier run" in ln]
    check("resume computes only the rest", m and f"{n} from an earlier run" in m[0], r.stdout)
    check("resume totals", m and f"{total} points, {total} done ({total - n} computed" in m[0], r.stdout)
    check("killed + rerun = uninterrupted", same_files(full, killed), "files differ")

    # --- shards 0/3 1/3 2/3 (run one after another, as GNU parallel would) merged = unsharded
    shard_dirs = []
    for i in range(3):
        d = os.path.join(tmp, f"shard{i}")
        r = run("sweep", slow, "--out", d, "--shard", f"{i}/3", "--quiet")
        check(f"shard {i} exit 0", r.returncode == 0, r.stderr)
        rows = read(os.path.join(d, "results.jsonl")).count(b"\n")
        check(f"shard {i} size", abs(rows - total / 3) < 1, (d, rows))  # 144 points: 48 each
        shard_dirs.append(d)
    merged = os.path.join(tmp, "merged")
    r = run("merge", merged, *reversed(shard_dirs))
    check("merge exit 0", r.returncode == 0, r.stderr)
    check("merged = unsharded", same_files(full, merged), "files differ")
    r = run("merge", os.path.join(tmp, "merged2"), shard_dirs[0], shard_dirs[2])
    check("merge missing shard exit 2", r.returncode == 2 and "missing shard" in r.stderr and "1/3" in r.stderr,
          r.stderr)
    r = run("merge", os.path.join(tmp, "merged3"), shard_dirs[0], shard_dirs[1], shard_dirs[1], shard_dirs[2])
    check("merge duplicate shard exit 2", r.returncode == 2 and "twice" in r.stderr, r.stderr)
    r = run("merge", os.path.join(tmp, "merged4"), shard_dirs[0], shard_dirs[1], out)
    check("merge other sweep exit 2", r.returncode == 2 and "different sweep" in r.stderr, r.stderr)
    r = run("merge", merged, *shard_dirs)
    check("merge into a full folder exit 2", r.returncode == 2 and "already holds" in r.stderr, r.stderr)
    # merge locks: a shard a sweep is writing into (its exclusive flock, held here as the sweep holds it) is
    # refused, naming the holder; an output folder another merge holds likewise; a shard another merge reads
    # (a shared flock) merges at the same time
    with open(os.path.join(shard_dirs[1], "sweep.lock")) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run("merge", os.path.join(tmp, "merged5"), *shard_dirs)
        check("merge of a shard a sweep writes: exit 2", r.returncode == 2 and "a sweep is writing into this shard"
              in r.stderr and "pid " in r.stderr, r.stderr)
        check("merge of a shard a sweep writes: nothing written",
              not os.path.exists(os.path.join(tmp, "merged5", "results.jsonl")), os.listdir(tmp))
    busy = os.path.join(tmp, "merged6")
    os.makedirs(busy)
    with open(os.path.join(busy, "sweep.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run("merge", busy, *shard_dirs)
        check("merge into a folder in use: exit 2", r.returncode == 2 and "a merge is using it" in r.stderr, r.stderr)
    with open(os.path.join(shard_dirs[0], "sweep.lock")) as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        r = run("merge", busy, *shard_dirs)
        check("merge while another merge reads a shard: exit 0", r.returncode == 0 and same_files(full, busy),
              r.stderr)
        r = run("sweep", slow, "--out", shard_dirs[0], "--shard", "0/3", "--quiet")
        check("sweep into a shard a merge reads: exit 2", r.returncode == 2 and "a merge is using it" in r.stderr,
              r.stderr)
    r = run("sweep", slow, "--out", shard_dirs[0], "--shard", "1/3")
    check("resume with another shard exit 2", r.returncode == 2 and "shard 0/3" in r.stderr, r.stderr)

    # --- the launchers of docs/sweeps.md: GNU parallel (when installed) and the Slurm array script (its
    # environment set by hand, as sbatch --array=1-3 would: the shards count from 0 whatever the first task id)
    if shutil.which("parallel"):
        pdir = os.path.join(tmp, "parallel")
        r = subprocess.run(["parallel", "--will-cite", BIN, "sweep", EXAMPLE, "--shard", "{}/4", "--out",
                            os.path.join(pdir, "shard{}"), "--quiet", ":::", "0", "1", "2", "3"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        check("gnu parallel exit 0", r.returncode == 0, r.stdout + r.stderr)
        r = run("merge", os.path.join(pdir, "merged"), *[os.path.join(pdir, f"shard{i}") for i in range(4)])
        check("gnu parallel merged = unsharded", r.returncode == 0 and same_files(out, os.path.join(pdir, "merged")),
              r.stderr)
    else:
        print("note: GNU parallel is not installed; its launcher is not tested")
    sdir = os.path.join(tmp, "slurm")
    for task in (1, 2, 3):
        env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_COUNT="3",
                   SLURM_CPUS_PER_TASK="1", HARMONY_SIM=BIN)
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts/slurm-sweep.sh"), EXAMPLE, sdir], capture_output=True,
                           text=True, cwd=ROOT, env=env, timeout=300)
        check(f"slurm task {task} exit 0", r.returncode == 0, r.stdout + r.stderr)
    r = run("merge", os.path.join(sdir, "merged"), *[os.path.join(sdir, f"shard-{i}") for i in range(3)])
    check("slurm shards merged = unsharded", r.returncode == 0 and same_files(out, os.path.join(sdir, "merged")),
          r.stderr)

    # --- a changed sweep is refused on resume
    changed = write(os.path.join(tmp, "changed.yaml"), read(slow).decode().replace("[32, 64]", "[32, 48]"))
    r = run("sweep", changed, "--out", full)
    check("changed sweep exit 2", r.returncode == 2 and "different sweep" in r.stderr and "hint" in r.stderr,
          r.stderr)
    check("changed sweep names sweep.json", os.path.join(full, "sweep.json") in r.stderr, r.stderr)

    # --- an edited profile: its rows are recomputed on rerun, the others kept; = a fresh run on the new files
    edir = os.path.join(tmp, "edit")
    os.makedirs(os.path.join(edir, "sweeps"))
    os.makedirs(os.path.join(edir, "profiles"))
    for f in ("example.yaml", "example_base.yaml"):
        shutil.copy(os.path.join(ROOT, "configs/sweeps", f), os.path.join(edir, "sweeps", f))
    for f in ("bert_large.json", "gpt2_medium.json"):
        shutil.copy(os.path.join(ROOT, "configs/profiles", f), os.path.join(edir, "profiles", f))
    esweep = os.path.join(edir, "sweeps", "example.yaml")
    eout = os.path.join(edir, "out")
    r = run("sweep", esweep, "--out", eout, "--quiet")
    check("edit: first run exit 0", r.returncode == 0, r.stderr)
    gpt = os.path.join(edir, "profiles", "gpt2_medium.json")
    text = open(gpt).read()
    check("edit: profile names its model", '"model":"gpt2_medium"' in text, text[:200])
    write(gpt, text.replace('"model":"gpt2_medium"', '"model":"gpt2_edited"'))
    r = run("sweep", esweep, "--out", eout, "--quiet")
    lines = [json.loads(x) for x in open(os.path.join(eout, "results.jsonl"))]
    names = {x["model_name"] for x in lines}
    check("edit: rerun exit 0", r.returncode == 0, r.stderr)
    check("edit: rows reflect the new profile", "gpt2_edited" in names and "gpt2_medium" not in names, names)
    # 48 gpt2 points, of which the 6 with plan.gpus=8 on the 4-GPU machine never read the profile
    check("edit: only its rows recomputed", "42 computed" in r.stdout and "42 of them recomputed" in r.stdout and
          "54 from an earlier run" in r.stdout, r.stdout)
    r = run("sweep", esweep, "--out", os.path.join(edir, "fresh"), "--quiet")
    check("edit: = a fresh run", same_files(eout, os.path.join(edir, "fresh"), ("results.csv", "results.jsonl")), "")

    # --- two sweeps on one --out: one runs, the other exits 2 naming the holder; the rows are not doubled
    two = os.path.join(tmp, "two")
    ps = [subprocess.Popen([BIN, "sweep", slow, "--out", two, "--threads", "1", "--quiet"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in ps]
    rcs = sorted(p.returncode for p in ps)
    loser = [o for p, o in zip(ps, outs) if p.returncode == 2]
    check("two writers: one exit 0, one exit 2", rcs == [0, 2], (rcs, outs))
    winner_pid = [p.pid for p in ps if p.returncode == 0]
    check("two writers: the refusal names the holder", loser and winner_pid and
          "another sweep is writing into this folder" in loser[0][1] and f"pid {winner_pid[0]} " in loser[0][1],
          loser)
    check("two writers: rows not doubled", same_files(full, two, ("results.csv", "results.jsonl")), "files differ")

    # --- a huge grid (101^3 x 9 = 9,272,709 points): refused at once with exit 2 unless --allow-large-grid;
    # allowed, it streams (rows appear at once, memory stays small) and stops on Ctrl-C
    vals = ", ".join(str(i) for i in range(1, 102))
    huge = write(os.path.join(tmp, "huge.yaml"), f"""base: {BASE}
grid:
  plan.minibatch: [{vals}]
  search.ubatch_step: [{vals}]
  search.top_k: [{vals}]
""")
    hout = os.path.join(tmp, "huge")
    start = time.time()
    r = run("sweep", huge, "--out", hout, timeout=60)
    check("huge grid: exit 2", r.returncode == 2, (r.returncode, r.stderr))
    huge_points = f"{101 ** 3 * SWEEP_KINDS} points"
    check("huge grid: names the count and the flag", huge_points in r.stderr and "--allow-large-grid" in r.stderr,
          r.stderr)
    check("huge grid: refused fast, writes nothing", time.time() - start < 20 and not os.path.exists(hout),
          time.time() - start)
    p = subprocess.Popen([BIN, "sweep", huge, "--out", hout, "--allow-large-grid", "--threads", "2", "--quiet"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)
    jl = os.path.join(hout, "results.jsonl")
    start = time.time()
    rss_kib = None
    while p.poll() is None and time.time() - start < 120:
        if os.path.exists(jl) and read(jl).count(b"\n") >= 50:
            with open(f"/proc/{p.pid}/status") as f:
                rss_kib = int(next(ln for ln in f if ln.startswith("VmRSS:")).split()[1])
            p.send_signal(signal.SIGINT)
            break
        time.sleep(0.01)
    pout, perr = p.communicate(timeout=120)
    check("huge grid allowed: rows stream", rss_kib is not None, (p.returncode, pout, perr))
    check("huge grid allowed: small memory", rss_kib is not None and rss_kib < 512 * 1024, rss_kib)
    check("huge grid allowed: ctrl-c exit 130", p.returncode == 130 and huge_points in pout, (p.returncode, pout))

    # --- the progress display sweep shares with search and compare: silent for a quick search; a compare that
    # runs past 2 s prints progress lines with ETA on stderr (not a terminal here), its JSON on stdout unchanged
    r = run("search", os.path.join(ROOT, "configs/examples/bert_large_search.yaml"), "--format", "json")
    check("quick search: no progress", r.returncode == 0 and r.stderr == "", r.stderr)
    r = run("compare", os.path.join(ROOT, "configs/examples/bert_large_search.yaml"), "--format", "json",
            # the paper's pack counts: long enough, not minutes (under the sanitizers a 256-sample minibatch is)
            "--set", "plan.minibatch=" + ("256" if SANITIZED else "2048"),
            "--set", "cost_model=native", "--set", "search.threads=1", "--set", "search.pack_counts=minimum")
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    check("long compare: json on stdout", doc.get("command") == "compare" and len(doc.get("results", [])) == len(PLAN_KINDS),
          r.stdout[:500] + r.stderr)
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("compare: ")]
    if doc.get("wall_time_s", 0) > 3:  # on a machine fast enough to finish within 2 s there is nothing to show
        check("long compare: progress lines", progress and all("candidates/s" in ln and "ETA" in ln for ln in progress)
              and f"{len(PLAN_KINDS)}/{len(PLAN_KINDS)} kinds finished" in progress[-1], r.stderr)
    check("long compare: stderr is only progress", len(progress) == len(r.stderr.splitlines()), r.stderr)

    # --- bad sweep files: exit 2, location, hint
    def bad(name, text, expect_loc, words, extra=()):
        path = write(os.path.join(tmp, name + ".yaml"), text)
        r = run("sweep", path, "--out", os.path.join(tmp, "bad_" + name), *extra)
        check(f"{name}: exit 2", r.returncode == 2, f"rc={r.returncode} {r.stdout} {r.stderr}")
        check(f"{name}: location", expect_loc in r.stderr, r.stderr)
        for w in words:
            check(f"{name}: says {w!r}", w in r.stderr, r.stderr)
        check(f"{name}: no crash", "internal error" not in r.stderr, r.stderr)

    bad("unknown_key", f"base: {BASE}\ngrid: {{plan.gpus: [1, 2]}}\nkind: [l2l]\n", "unknown_key.yaml:3:1",
        ["unknown sweep key 'kind'", "did you mean 'kinds'"])
    bad("bad_override_key", f"base: {BASE}\ngrid:\n  plan.gpus: [1, 2]\n  plan.minibatchh: [16]\n",
        "bad_override_key.yaml:4:3", ["minibatchh", "did you mean 'minibatch'"])
    bad("bad_section", f"base: {BASE}\ngrid:\n  plann.gpus: [1, 2]\n", "bad_section.yaml:3:3", ["plann", "'plan'"])
    bad("bad_kind", f"base: {BASE}\nkinds: [harmony-pp, zero-infinty]\n", "bad_kind.yaml:2:21",
        ["zero-infinity"])
    bad("no_base", "grid: {plan.gpus: [1]}\n", "no_base.yaml", ["base"])
    bad("missing_base", "base: nowhere.yaml\n", "missing_base.yaml:1:7", ["nowhere.yaml"])
    bad("malformed", f"base: {BASE}\ngrid: {{plan.gpus: [1, 2}}\n", "malformed.yaml:2:", ["YAML"])
    bad("bad_shard", f"base: {BASE}\n", "--shard 3/3", ["I/N"], extra=("--shard", "3/3"))
    r = run("sweep", EXAMPLE)
    check("missing --out exit 2", r.returncode == 2, r.returncode)
    r = run("merge")
    check("merge without args exit 2", r.returncode == 2, r.returncode)

finish()
