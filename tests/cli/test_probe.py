#!/usr/bin/env python3
"""End-to-end tests of `harmony-run probe` (docs/machines.md, "Measuring a machine"): the quick default measures
this machine (host AdamW, memcpy, bf16 casts, pinned memory, a folder's drive), its JSON matches
schemas/probe.schema.json, the machine file it writes loads in harmony-sim and changes a prediction that prices
the CPU optimizer, the drive's test file is removed (after a run, and on SIGTERM), and bad input exits 2 with the
flag or path named, nothing written."""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

from clitest import ROOT, check, default_signals, finish, runner

RUN = sys.argv[1]
SIM = sys.argv[2]
run = runner(RUN)


def schema_errors(doc):
    try:
        import jsonschema
    except ImportError:
        return ["python3-jsonschema is missing; install it with scripts/install-deps.sh"]
    with open(os.path.join(ROOT, "schemas", "probe.schema.json")) as f:
        schema = json.load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        v = jsonschema.Draft7Validator(schema)
        return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in v.iter_errors(doc)]


def leftovers(folder):
    return glob.glob(os.path.join(folder, "harmony-probe-*.tmp"))


SIM_CONFIG = """model: {{analytic: {{preset: gpt2-medium, ubatch_sizes: [1, 2]}}}}
machine: {machine}
cost_model: reference
plan: {{mode: harmony-pp, gpus: 2, minibatch: 4, u_fwd: 2, u_bwd: 2, pack_size: 7}}
"""


def iteration_time(tmp, machine, name):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(SIM_CONFIG.format(machine=machine))
    r = run("simulate", path, "--format", "json", binary=SIM)
    check(f"harmony-sim simulate ({machine}) exit 0", r.returncode == 0, r.stderr)
    return json.loads(r.stdout)["result"]["iteration_time_s"] if r.returncode == 0 else None


with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR") if os.environ.get("TMPDIR") else None) as tmp:
    # A folder on a drive: the build tree's file system when the temporary one is in memory (tmpfs is refused).
    drive = tmp
    if subprocess.run(["stat", "-f", "-c", "%T", tmp], capture_output=True, text=True).stdout.strip() in ("tmpfs",
                                                                                                           "ramfs"):
        drive = tempfile.mkdtemp(dir=os.getcwd())
    out = os.path.join(tmp, "probed.yaml")

    # --- the quick default, JSON, a machine file on the paper testbed's preset, the drive measured ---
    t0 = time.monotonic()
    r = run("probe", "--quiet", "--base", "paper-1080ti", "--path", drive, "--out", out, "--format", "json")
    took = time.monotonic() - t0
    check("probe exit 0", r.returncode == 0, r.stderr)
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    check("probe JSON matches schemas/probe.schema.json", doc and not schema_errors(doc), schema_errors(doc)[:5])
    check("quick by default (under 60 s even on a loaded CI machine)", took < 60, took)
    if doc:
        rates = doc["rates"]
        for k in ("adamw_fp32", "adamw_bf16", "adamw_fp16", "memcpy", "memcpy_one_thread", "nvme_read", "nvme_write"):
            check(f"rate {k} measured", rates.get(k) and rates[k]["best_bytes_per_s"] > 0, rates.get(k))
        check("the drive measured in the folder", doc["nvme"] and doc["nvme"]["path"] == drive, doc["nvme"])
        keys = {k["key"]: k for k in doc["machine_keys"]}
        for k in ("cpu_adam.bandwidth", "cpu_adam.bandwidth_bf16", "cpu_adam.bandwidth_fp16", "topology.host_memcpy",
                  "topology.nvme.read", "topology.nvme.write"):
            check(f"{k} written", keys.get(k, {}).get("written"), keys.get(k))
        if not doc["device_pins_host_memory"]:  # no GPU here: the host link's keys are left, with the reason
            for k in ("host_paths.pinned_h2d", "host_paths.pinned_d2h"):
                check(f"{k} not written without a GPU", not keys[k]["written"] and "pins nothing" in keys[k]["note"],
                      keys[k])
            check("the JSON says why the copies are no host link's", doc["device_note"], doc["device_note"])
        check("out_path in the JSON", doc["out_path"] == out, doc["out_path"])
    check("the drive's test file removed", not leftovers(drive), leftovers(drive))
    check("the machine file written", os.path.isfile(out))
    check("no temporary file beside it", sorted(os.listdir(tmp)) == ["probed.yaml"], os.listdir(tmp))
    text = open(out).read() if os.path.isfile(out) else ""
    check("the machine file names its base and the command", 'preset: "paper-1080ti"' in text and
          "harmony-run probe" in text, text[:400])
    check("each measured key says where it comes from", "harmony-run probe on" in text and "best of" in text,
          text[:800])

    # --- harmony-sim reads the file, and a prediction that prices the CPU optimizer follows it ---
    if os.path.isfile(out):
        t_preset = iteration_time(tmp, "paper-1080ti", "preset.yaml")
        t_probed = iteration_time(tmp, "probed.yaml", "probed-run.yaml")
        check("the probed machine changes the prediction", t_preset and t_probed and t_preset != t_probed,
              (t_preset, t_probed))
        slow = os.path.join(tmp, "slow.yaml")
        with open(slow, "w") as f:
            f.write("file: probed.yaml\ncpu_adam: {bandwidth: 10MB/s}\n")
        t_slow = iteration_time(tmp, "slow.yaml", "slow-run.yaml")
        check("a slower cpu_adam makes the prediction slower", t_slow and t_probed and t_slow > t_probed,
              (t_probed, t_slow))

    # --- the table (the default format), no machine file ---
    r = run("probe", "--quiet")
    check("table exit 0", r.returncode == 0, r.stderr)
    check("table shows the AdamW rate and its key", "host AdamW fp32" in r.stdout and "cpu_adam.bandwidth" in
          r.stdout, r.stdout[:600])
    check("table says no file was written", "no machine file written" in r.stdout, r.stdout[-300:])

    # --- a stop signal while the drive's test file exists: the file is removed, the process ends by the signal ---
    p = subprocess.Popen([RUN, "probe", "--quiet", "--path", drive, "--file-size", "1GiB"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    seen = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if leftovers(drive):
            seen = True
            time.sleep(0.2)
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.02)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    check("the test file appeared before the signal", seen, p.stderr.read() if p.stderr else "")
    if seen:
        check("SIGTERM ends the probe by the signal", p.returncode == -signal.SIGTERM, p.returncode)
    check("SIGTERM leaves no test file", not leftovers(drive), leftovers(drive))

    # --- bad input: exit 2, the flag or path named, nothing written ---
    bad_out = os.path.join(tmp, "bad.yaml")
    a_file = os.path.join(tmp, "a-file")
    open(a_file, "w").close()
    cases = [
        ("a missing --path folder", ["--path", os.path.join(tmp, "no-such-dir")], "no-such-dir"),
        ("--path a file", ["--path", a_file], "not a folder"),
        ("--file-size not a size", ["--path", drive, "--file-size", "lots"], "--file-size"),
        ("--file-size too small", ["--path", drive, "--file-size", "1KiB"], "at least 4 MiB"),
        ("--file-size larger than the drive's free space", ["--path", drive, "--file-size", "1000000GiB"],
         "twice its test file free"),
        ("an unknown --base", ["--base", "no-such-preset"], "no-such-preset"),
        ("an unknown --device", ["--device", "tpu"], "--device"),
        ("a bad --format", ["--format", "xml"], "--format"),
    ]
    if os.path.isdir("/dev/shm") and subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True,
                                                    text=True).stdout.strip() == "tmpfs":
        cases.append(("--path on tmpfs", ["--path", "/dev/shm"], "tmpfs"))
    for name, args, needle in cases:
        r = run("probe", "--quiet", "--out", bad_out, *args)
        check(f"{name}: exit 2", r.returncode == 2, (r.returncode, r.stderr))
        check(f"{name}: the message names it", needle in r.stderr, r.stderr)
        check(f"{name}: nothing measured", "host AdamW" not in r.stdout, r.stdout[:200])
    check("bad input writes no machine file", not os.path.exists(bad_out))
    r = run("probe", "--quiet", "--out", os.path.join(tmp, "no-such-dir", "m.yaml"))
    check("--out in a missing folder: exit 2", r.returncode == 2, (r.returncode, r.stderr))
    check("no test file left by the bad runs", not leftovers(drive), leftovers(drive))
    if drive != tmp:
        os.rmdir(drive)

finish("test_probe: ")
