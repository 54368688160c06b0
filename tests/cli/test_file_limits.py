#!/usr/bin/env python3
"""Every writer of harmony-sim and harmony-run under a file size limit (RLIMIT_FSIZE, `ulimit -f`; issue 32), with
SIGXFSZ at its default disposition (the binaries ignore it themselves): exit 2 naming the file, "File too large"
and the limit, the previous file intact, no *.tmp left; a sweep keeps whole rows only and a rerun finishes it to
the bytes of an unlimited run; a checkpoint that does not fit stops training with the previous one valid; a
failed write to stdout is exit 1 with the reason and the limit (docs/backend.md's exit codes).
Arguments: harmony-run and harmony-sim paths."""
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile

from clitest import ROOT, check, finish, run as run_in_root

RUN = sys.argv[1]
SIM = sys.argv[2]
DEFAULT = os.path.join(ROOT, "configs/run/default.yaml")
SIMCFG = os.path.join(ROOT, "configs/examples/bert_large_simulate.yaml")


def limited(nbytes):
    """A child with RLIMIT_FSIZE = nbytes and SIGXFSZ at its default action (as a shell's `ulimit -f` leaves it)."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return apply


def run(binary, *args, limit=None, stdout=subprocess.PIPE):
    return run_in_root(binary, *args, stdout=stdout, preexec_fn=limited(limit) if limit is not None else None)


def temps(*dirs):
    return [os.path.join(d, f) for d in dirs if os.path.isdir(d) for f in os.listdir(d) if ".tmp" in f]


def refused(name, r, path, limit):
    """Exit 2 (not 153 = killed by SIGXFSZ), the file, the reason and the limit in bytes named."""
    check(f"{name}: exit 2 (not killed by SIGXFSZ)", r.returncode == 2, (r.returncode, r.stderr))
    check(f"{name}: names {os.path.basename(path)}, 'File too large' and the limit",
          path in r.stderr and "File too large" in r.stderr and f"{limit} bytes" in r.stderr and
          "ulimit -f" in r.stderr, r.stderr)


def previous(path, text):
    with open(path, "w") as f:
        f.write(text)


def content(path):
    with open(path) as f:
        return f.read()


with tempfile.TemporaryDirectory() as tmp:
    def fresh(name):
        """A folder of its own per case, so that one case's temp file is not counted against another."""
        d = os.path.join(tmp, name)
        os.mkdir(d)
        return d

    # --- harmony-sim simulate --trace: the trace of the bundled example is ~1 MiB
    trace = os.path.join(fresh("sim-trace"), "sim.json")
    previous(trace, "previous trace")
    r = run(SIM, "simulate", SIMCFG, "--trace", trace, limit=4096)
    refused("simulate --trace", r, trace, 4096)
    check("simulate --trace: the previous trace intact, no temp", content(trace) == "previous trace" and
          not temps(os.path.dirname(trace)), temps(os.path.dirname(trace)))

    # --- harmony-sim sweep: 8 points of ~1 KiB per JSON row; sweep.json (~1.5 KiB) is written first
    sweep = os.path.join(tmp, "sweep.yaml")
    previous(sweep, f"base: {ROOT}/configs/sweeps/example_base.yaml\ngrid:\n  plan.gpus: [1, 2, 4, 8]\n"
                    "kinds: [harmony-pp, harmony-dp]\n")
    lock_dir = os.path.join(tmp, "sw-lock")
    r = run(SIM, "sweep", sweep, "--out", lock_dir, "--quiet", limit=8)  # "pid N on host H" does not fit
    refused("sweep (the lock file's pid over the limit)", r, os.path.join(lock_dir, "sweep.lock"), 8)
    check("sweep lock: nothing else written", sorted(os.listdir(lock_dir)) == ["sweep.lock"], os.listdir(lock_dir))
    meta_dir = os.path.join(tmp, "sw-meta")
    r = run(SIM, "sweep", sweep, "--out", meta_dir, "--quiet", limit=512)
    refused("sweep (sweep.json over the limit)", r, os.path.join(meta_dir, "sweep.json"), 512)
    check("sweep.json: neither it nor a temp left", not os.path.exists(os.path.join(meta_dir, "sweep.json")) and
          not temps(meta_dir), os.listdir(meta_dir) if os.path.isdir(meta_dir) else None)
    cut = os.path.join(tmp, "sw-cut")
    r = run(SIM, "sweep", sweep, "--out", cut, "--quiet", "--threads", "2", limit=4096)
    refused("sweep rows", r, os.path.join(cut, "results.jsonl"), 4096)
    csv_text = content(os.path.join(cut, "results.csv"))
    jsonl_text = content(os.path.join(cut, "results.jsonl"))
    csv_rows = csv_text.splitlines()[1:]
    jsonl_rows = jsonl_text.splitlines()
    check("sweep rows: whole rows only, the same points in both files",
          csv_text.endswith("\n") and jsonl_text.endswith("\n") and 0 < len(jsonl_rows) < 8 and
          len(csv_rows) == len(jsonl_rows) and
          all(c.split(",")[0] == str(json.loads(j)["point"]) for c, j in zip(csv_rows, jsonl_rows)),
          (len(csv_rows), len(jsonl_rows), jsonl_text[-80:]))
    check("sweep rows: no temp", not temps(cut), temps(cut))
    r = run(SIM, "sweep", sweep, "--out", cut, "--quiet")
    full = os.path.join(tmp, "sw-full")
    r2 = run(SIM, "sweep", sweep, "--out", full, "--quiet")
    check("sweep rerun without the limit: exit 0, the kept rows resumed", r.returncode == 0 and r2.returncode == 0 and
          f"{len(jsonl_rows)} from an earlier run" in r.stdout, (r.stdout, r.stderr, r2.stderr))
    check("sweep rerun: the files of an unlimited run, byte for byte",
          all(content(os.path.join(cut, f)) == content(os.path.join(full, f)) for f in ("results.csv", "results.jsonl")))

    # --- harmony-sim merge: the merged files are written atomically
    merged = os.path.join(tmp, "merged")
    r = run(SIM, "merge", merged, full, limit=1024)
    check("merge over the limit: exit 2 naming a merged file and the limit", r.returncode == 2 and merged in r.stderr
          and "File too large" in r.stderr and "1024 bytes" in r.stderr, (r.returncode, r.stderr))
    check("merge: no temp", not temps(merged), temps(merged))

    # --- harmony-sim report: the page (~0.7 MiB) and its traces beside it
    page = os.path.join(fresh("report"), "report.html")
    previous(page, "previous page")
    r = run(SIM, "report", full, "--out", page, limit=8192)
    check("report over the limit: exit 2, 'File too large' and the limit", r.returncode == 2 and
          "File too large" in r.stderr and "8192 bytes" in r.stderr and "report written" not in r.stdout,
          (r.returncode, r.stderr))
    check("report: the previous page intact, no temp", content(page) == "previous page" and
          not temps(os.path.dirname(page)), temps(os.path.dirname(page)))

    # --- stdout into a file over the limit: exit 1 (a failed write to stdout), the reason and the limit
    with open(os.path.join(tmp, "stdout.json"), "w") as out:
        r = run(SIM, "simulate", SIMCFG, "--format", "json", limit=256, stdout=out)
    check("harmony-sim --format json > file over the limit: exit 1 with the reason and the limit",
          r.returncode == 1 and "writing stdout: File too large" in r.stderr and "256 bytes" in r.stderr,
          (r.returncode, r.stderr))
    with open(os.path.join(tmp, "stdout-run.json"), "w") as out:
        r = run(RUN, "train", DEFAULT, "--steps", "1", "--quiet", "--format", "json", limit=256, stdout=out)
    check("harmony-run --format json > file over the limit: exit 1 with the reason and the limit",
          r.returncode == 1 and "writing stdout: File too large" in r.stderr and "256 bytes" in r.stderr,
          (r.returncode, r.stderr))

    # --- harmony-run: the trace, the weights, the profile
    run_trace = os.path.join(fresh("run-trace"), "run.json")
    previous(run_trace, "previous trace")
    r = run(RUN, "train", DEFAULT, "--steps", "1", "--quiet", "--trace", run_trace, limit=4096)
    refused("train --trace", r, run_trace, 4096)
    check("train --trace: the previous trace intact, no temp", content(run_trace) == "previous trace" and
          not temps(os.path.dirname(run_trace)), temps(os.path.dirname(run_trace)))
    weights = os.path.join(fresh("weights"), "w.safetensors")
    previous(weights, "previous weights")
    r = run(RUN, "train", DEFAULT, "--steps", "1", "--quiet", "--save-weights", weights, limit=65536)
    refused("train --save-weights", r, weights, 65536)
    check("--save-weights: the previous weights intact, no temp", content(weights) == "previous weights" and
          not temps(os.path.dirname(weights)), temps(os.path.dirname(weights)))
    profile = os.path.join(fresh("profile"), "profile.json")
    previous(profile, "previous profile")
    r = run(RUN, "profile", DEFAULT, "--out", profile, "--repeats", "1", limit=1024)
    refused("profile --out", r, profile, 1024)
    check("profile --out: the previous profile intact, no temp", content(profile) == "previous profile" and
          not temps(os.path.dirname(profile)), temps(os.path.dirname(profile)))

    # --- harmony-run checkpoints (~5 MiB for the default model). Under the first one's size: nothing saved, the
    # run stops at step 1 with exit 2. At exactly the first one's size: step 1 saved, step 2's (8 bytes longer, one
    # more loss) refused; the run stops there and step 1's checkpoint resumes.
    probe = os.path.join(tmp, "ck-probe")
    r = run(RUN, "train", DEFAULT, "--steps", "1", "--quiet", "--checkpoint-dir", probe)
    first_size = os.path.getsize(os.path.join(probe, "step-000001.hckpt"))
    ck = os.path.join(tmp, "ck-none")
    r = run(RUN, "train", DEFAULT, "--steps", "3", "--quiet", "--checkpoint-dir", ck, "--checkpoint-every", "1",
            limit=first_size - 1)
    refused("first checkpoint over the limit", r, os.path.join(ck, "step-000001.hckpt"), first_size - 1)
    def saved(d):  # the folder's files but its lock (harmony-run.lock: the run's, not a checkpoint)
        return sorted(f for f in os.listdir(d) if f != "harmony-run.lock") if os.path.isdir(d) else None

    check("first checkpoint over the limit: nothing saved, no temp", not os.path.isdir(ck) or saved(ck) == [],
          saved(ck))
    ck = os.path.join(tmp, "ck")
    r = run(RUN, "train", DEFAULT, "--steps", "3", "--quiet", "--checkpoint-dir", ck, "--checkpoint-every", "1",
            limit=first_size)
    refused("second checkpoint over the limit", r, os.path.join(ck, "step-000002.hckpt"), first_size)
    check("second checkpoint over the limit: the first kept, no temp",
          saved(ck) == ["step-000001.hckpt"], os.listdir(ck))
    check("second checkpoint over the limit: the hint says the previous checkpoints are untouched",
          "previous checkpoints are untouched" in r.stderr, r.stderr)
    r = run(RUN, "train", DEFAULT, "--steps", "3", "--quiet", "--checkpoint-dir", ck, "--resume")
    check("the kept checkpoint resumes to the end", r.returncode == 0 and "step-000003.hckpt" in os.listdir(ck),
          (r.returncode, r.stderr))

finish()
