#!/usr/bin/env python3
"""The calibration loop end to end, small (issue 14): harmony-run profile -> train two Programs with traces ->
harmony-sim calibrate on one -> predict both with the calibrated machine (--check) -> harmony-run trains on the
calibrated machine file. Checks that every step completes, its outputs parse, the fit is deterministic and bad
input (a run of another Program, a trace without timings, no JSON) is a located exit 2. Accuracy is measured by
scripts/validate-cpu.py, never asserted here."""
import functools
import json
import os
import sys
import tempfile
import warnings

import jsonschema

from clitest import ROOT, check, finish, run as run_in_root

RUN = sys.argv[1]
SIM = sys.argv[2]
MACHINE = os.path.join(ROOT, "configs/machines/cpu-4x.yaml")
run = functools.partial(run_in_root, timeout=600)


def validate(what, doc):
    """calibrate's JSON against schemas/calibrate.schema.json (docs/output-schema.md), as test_schema.py does."""
    store = {}
    for name in os.listdir(os.path.join(ROOT, "schemas")):
        with open(os.path.join(ROOT, "schemas", name)) as f:
            store[name] = json.load(f)
    schema = store["calibrate.schema.json"]
    with warnings.catch_warnings():  # RefResolver: deprecated in newer jsonschema, the one API every version has
        warnings.simplefilter("ignore", DeprecationWarning)
        resolver = jsonschema.RefResolver(base_uri=schema["$id"], referrer=schema,
                                          store={s["$id"]: s for s in store.values()})
        errors = list(jsonschema.Draft7Validator(schema, resolver=resolver).iter_errors(doc))
    check(f"{what} matches calibrate.schema.json", not errors, "; ".join(e.message[:300] for e in errors[:5]))


def config(tmp, name, profile, machine, plan, mem):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("model:\n  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}\n"
                f"  seq_len: 32\n  init_seed: 1\n  profile: {profile}\n"
                f"machine: {{file: {machine}, gpu_memory: {mem}}}\ndevice: cpu\ncost_model: native\n"
                f"plan: {{{plan}}}\ntrain:\n  steps: 2\n  lr: 3e-3\n  data: {{synthetic_tokens: 4096, seed: 1}}\n")
    return path


with tempfile.TemporaryDirectory(prefix="harmony-calibrate-") as tmp:
    profile = os.path.join(tmp, "profile.json")
    r = run(RUN, "profile", os.path.join(ROOT, "configs/run/default.yaml"), "--out", profile, "--gpu-memory", "64MiB",
            "--repeats", "1", "--ubatch", "2")
    check("profile", r.returncode == 0, r.stderr)
    plans = [("a", "mode: harmony-dp, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, pack_size: 5", "8MiB"),
             ("b", "mode: pp-swap, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2", "16MiB")]
    runs = {}
    for name, plan, mem in plans:
        cfg = config(tmp, f"{name}.yaml", profile, MACHINE, plan, mem)
        trace = os.path.join(tmp, f"{name}.trace.json")
        r = run(RUN, "train", cfg, "--steps", "2", "--format", "json", "--executor", "concurrent", "--trace", trace)
        check(f"train {name}", r.returncode == 0, r.stderr)
        out = os.path.join(tmp, f"{name}.json")
        with open(out, "w") as f:
            f.write(r.stdout)
        runs[name] = (cfg, trace, out)

    fitted = os.path.join(tmp, "fitted.yaml")
    a = ",".join(runs["a"])
    r = run(SIM, "calibrate", MACHINE, "--run", a, "--out", fitted, "--format", "json")
    check("calibrate exits 0", r.returncode == 0, r.stderr)
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    check("calibrate JSON: fitted values", doc.get("fitted") is True and doc["values"]["compute"]["time_scale"] > 0,
          r.stdout)
    validate("calibrate --format json", doc)
    check("calibrate JSON: one run with a prediction", len(doc.get("runs", [])) == 1 and
          doc["runs"][0]["predicted_step_time_s"] > 0 and doc["runs"][0]["measured_step_time_s"] > 0, r.stdout)
    check("calibrate JSON: residual per op class",
          {c["op_class"] for c in doc.get("classes", [])} >= {"compute", "update"}, r.stdout)
    text = open(fitted).read() if os.path.exists(fitted) else ""
    check("provenance comment", "# calibrate: fitted by `harmony-sim calibrate`" in text and
          "a.trace.json (" in text, text)
    check("fitted keys written", "\ncompute: {units:" in text and "\ndispatch: {compute:" in text, text)
    check("the machine's other keys kept", "name: cpu-4x" in text and "gpus: 4" in text, text)
    again = os.path.join(tmp, "again.yaml")
    r = run(SIM, "calibrate", MACHINE, "--run", a, "--out", again)
    check("table output", r.returncode == 0 and "per op class" in r.stdout and "compute" in r.stdout, r.stdout)
    check("deterministic", os.path.exists(again) and open(again).read() == text)
    refit = os.path.join(tmp, "refit.yaml")
    r = run(SIM, "calibrate", fitted, "--run", a, "--out", refit)
    check("calibrating a calibrated file replaces its keys", r.returncode == 0 and
          open(refit).read().count("\ncompute:") == 1 and open(refit).read().count("fitted by") == 1, r.stderr)

    # a machine that says its devices are threads on 2 host cores: the fit keeps the cores (a fact) and says so
    host = os.path.join(tmp, "host.yaml")
    with open(host, "w") as f:
        f.write("".join(x for x in open(MACHINE).readlines() if not x.startswith("compute:")) +
                "compute: {units: 2, host_cores: true}\n")
    host_fit = os.path.join(tmp, "host-fitted.yaml")
    r = run(SIM, "calibrate", host, "--run", a, "--run", ",".join(runs["b"]), "--out", host_fit, "--format", "json")
    hdoc = json.loads(r.stdout) if r.returncode == 0 else {}
    check("host cores: calibrate exits 0", r.returncode == 0, r.stderr)
    check("host cores: units kept, host_cores true", hdoc.get("values", {}).get("compute", {}).get("units") == 2 and
          hdoc["values"]["compute"]["host_cores"] is True, r.stdout)
    validate("calibrate --format json (host cores)", hdoc)
    htext = open(host_fit).read() if os.path.exists(host_fit) else ""
    wake = hdoc.get("values", {}).get("compute", {}).get("wake_s", 0)
    check("host cores: the runs' hand-off wait measured (compute.wake, seconds)", 0 < wake < 0.1, r.stdout)
    check("host cores: written to the machine file", "host_cores: true, wake: " in htext and
          htext.count("\ncompute:") == 1, htext)
    r = run(SIM, "calibrate", host_fit, "--run", a, "--check", "--format", "json")
    check("host cores: the fitted file predicts", r.returncode == 0 and
          json.loads(r.stdout)["runs"][0]["predicted_step_time_s"] > 0, r.stderr)

    # predict both Programs on the calibrated machine
    r = run(SIM, "calibrate", fitted, "--run", a, "--run", ",".join(runs["b"]), "--check", "--format", "json")
    check("predict (--check) exits 0", r.returncode == 0, r.stderr)
    pred = json.loads(r.stdout) if r.returncode == 0 else {}
    check("predictions of both runs", len(pred.get("runs", [])) == 2 and
          all(x["predicted_step_time_s"] > 0 for x in pred["runs"]), r.stdout)
    check("--check writes nothing", pred.get("out_path") is None and pred.get("fitted") is False, r.stdout)
    validate("calibrate --check --format json", pred)

    # run on the calibrated machine file
    cfg = config(tmp, "on_fitted.yaml", profile, fitted, plans[0][1], "8MiB")
    r = run(RUN, "train", cfg, "--steps", "1", "--format", "json")
    check("harmony-run trains on the calibrated machine", r.returncode == 0 and json.loads(r.stdout)["steps"], r.stderr)

    # bad input: located errors, exit 2
    r = run(SIM, "calibrate", MACHINE, "--run", f"{runs['b'][0]},{runs['a'][1]}", "--out", os.path.join(tmp, "x.yaml"))
    check("trace of another Program: exit 2", r.returncode == 2, r.stderr)
    check("trace of another Program: located", "a.trace.json:" in r.stderr and "another" in r.stderr, r.stderr)
    doc = json.load(open(runs["a"][1]))
    for e in doc["traceEvents"]:
        e.pop("dur", None)
    untimed = os.path.join(tmp, "untimed.json")
    with open(untimed, "w") as f:
        json.dump(doc, f, indent=1)
    r = run(SIM, "calibrate", MACHINE, "--run", f"{runs['a'][0]},{untimed}", "--out", os.path.join(tmp, "x.yaml"))
    check("trace without timings: exit 2, located", r.returncode == 2 and "untimed.json:" in r.stderr and
          "no timing" in r.stderr, r.stderr)
    broken = os.path.join(tmp, "broken.json")
    with open(broken, "w") as f:
        f.write('{"traceEvents": [\n  {"ph": "X",,}\n]}\n')
    r = run(SIM, "calibrate", MACHINE, "--run", f"{runs['a'][0]},{broken}", "--out", os.path.join(tmp, "x.yaml"))
    check("not JSON: exit 2 at line 2", r.returncode == 2 and "broken.json:2:" in r.stderr, r.stderr)
    r = run(SIM, "calibrate", MACHINE, "--run", runs["a"][0], "--out", os.path.join(tmp, "x.yaml"))
    check("--run without a trace: exit 2", r.returncode == 2 and "CONFIG,TRACE" in r.stderr, r.stderr)
    r = run(SIM, "calibrate", MACHINE, "--run", f"{runs['a'][0]},{runs['a'][1]},{runs['b'][2]}", "--out",
            os.path.join(tmp, "x.yaml"))
    check("step times of another plan: exit 2", r.returncode == 2 and "another" in r.stderr, r.stderr)
    check("no output on error", not os.path.exists(os.path.join(tmp, "x.yaml")))

finish()
