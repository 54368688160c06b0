#!/usr/bin/env python3
"""End-to-end tests of `harmony-sim compare CONFIG --deepspeed ds_config.json`: the README's command on the shipped
DeepSpeed examples (configs/deepspeed/: exit 0, the marked row and its reasoning in the table, the `deepspeed` object
of --format json valid against schemas/compare.schema.json and consistent with the table's kinds), ZeRO-3 with only
the optimizer offloaded under gradient accumulation (zero3-opt-offload, priced), ZeRO-3 without offload (zero3, slower
than fsdp by its hooks), and bad files: exit 2 with the DeepSpeed
config's file:line:column and a hint."""
import json
import os
import sys
import tempfile
import warnings

import jsonschema

from clitest import ROOT, check, finish, runner

BIN = sys.argv[1]
CFG = "configs/deepspeed/gpt2_medium.yaml"
run = runner(BIN)


def validate(doc):
    store = {}
    for name in os.listdir(os.path.join(ROOT, "schemas")):
        if name.endswith(".schema.json"):
            with open(os.path.join(ROOT, "schemas", name)) as f:
                s = json.load(f)
                store[s["$id"]] = s
    schema = next(s for s in store.values() if s["$id"].endswith("/compare.schema.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        resolver = jsonschema.RefResolver(base_uri=schema["$id"], referrer=schema, store=store)
        errors = list(jsonschema.Draft7Validator(schema, resolver=resolver).iter_errors(doc))
    return "; ".join(f"/{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:5])


EXPECT = {  # example -> (plan kind, offload, status)
    "zero3_offload_cpu.json": ("zero-infinity", "cpu", "priced"),
    "zero3_offload_nvme.json": ("zero-infinity", "nvme", "priced"),
    "zero2_offload_optimizer.json": ("zero-offload", None, "priced"),
}
for name, (kind, offload, status) in EXPECT.items():
    ds = os.path.join("configs/deepspeed", name)
    r = run("compare", CFG, "--deepspeed", ds, "--quiet")
    check(f"{name}: table exit 0", r.returncode == 0, r.stderr)
    rows = [line for line in r.stdout.splitlines() if line.startswith("> deepspeed")]
    check(f"{name}: one marked row", len(rows) == 1 and "your DeepSpeed config: ZeRO-" in rows[0], r.stdout)
    check(f"{name}: the row names the kind", rows and f"-> {kind}" in rows[0], rows)
    check(f"{name}: the reasoning and the ratio", "  why: " in r.stdout and "Harmony's best plan on the same machine"
          in r.stdout, r.stdout[-3000:])
    if status == "approximate":
        check(f"{name}: says approximate and why", "  approximate: " in r.stdout, r.stdout[-3000:])
    check(f"{name}: not priced listed", "  not priced: " in r.stdout and "optimizer" in r.stdout, r.stdout[-3000:])
    r = run("compare", CFG, "--deepspeed", ds, "--quiet", "--format", "json")
    check(f"{name}: json exit 0", r.returncode == 0, r.stderr)
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    problems = validate(doc)
    check(f"{name}: json matches compare.schema.json", not problems, problems)
    d = doc.get("deepspeed") or {}
    check(f"{name}: kind, tier, status", (d.get("plan_kind"), d.get("offload"), d.get("status")) ==
          (kind, offload, status), d)
    check(f"{name}: batch = micro x accum x gpus", d.get("train_batch_size") ==
          d.get("train_micro_batch_size_per_gpu", 0) * d.get("gradient_accumulation_steps", 0) * d.get("gpus", 0), d)
    check(f"{name}: compare runs at the DeepSpeed batch", doc.get("minibatch") == d.get("train_batch_size"), doc)
    check(f"{name}: priced and fits", d.get("feasible") is True and d["best"]["u_bwd"] ==
          d.get("train_micro_batch_size_per_gpu"), d)
    kinds = {k["plan_kind"]: k for k in doc.get("results", [])}
    h = d.get("harmony_best") or {}
    best = min((k["best"]["iteration_time_s"] for p, k in kinds.items() if p.startswith("harmony") and k["feasible"]),
               default=None)
    check(f"{name}: Harmony's best is the faster Harmony kind", h.get("iteration_time_s") == best, (h, best))
    if best and d.get("best"):
        check(f"{name}: ratio", abs(d["time_ratio"] - d["best"]["iteration_time_s"] / best) < 1e-12, d["time_ratio"])

# --- the README's numbers: ZeRO-3 CPU offload's row equals zero-infinity's best at its microbatch
r = run("compare", CFG, "--deepspeed", "configs/deepspeed/zero3_offload_cpu.json", "--quiet", "--format", "json")
doc = json.loads(r.stdout) if r.returncode == 0 else {}
zi = next((k for k in doc.get("results", []) if k["plan_kind"] == "zero-infinity"), None)
d = doc.get("deepspeed") or {}
if zi and zi["feasible"] and zi["best"]["u_bwd"] == d.get("train_micro_batch_size_per_gpu") and \
        zi["best"]["activation_policy"] == "checkpoint":
    check("zero3 cpu: the same plan as compare's zero-infinity", d["best"]["iteration_time_s"] ==
          zi["best"]["iteration_time_s"], (d.get("best"), zi["best"]))

with tempfile.TemporaryDirectory() as tmp:
    def write(name, text):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    # --- ZeRO-Offload (stage 2) with gradient accumulation: zero-offload, approximate (the micro-steps' host traffic)
    p = write("acc2.json", '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,\n'
                           ' "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}\n')
    r = run("compare", CFG, "--deepspeed", p, "--quiet", "--format", "json")
    d = (json.loads(r.stdout) if r.returncode == 0 else {}).get("deepspeed") or {}
    check("stage 2 with accumulation: approximate zero-offload, priced", d.get("plan_kind") == "zero-offload" and
          d.get("status") == "approximate" and "4 micro-steps" in (d.get("approximation") or "") and
          d.get("best") is not None, d)
    # --- ZeRO-3 with the optimizer alone offloaded and gradient accumulation: zero3-opt-offload, priced (it moves
    # every micro-step's gradient shard through the host, as DeepSpeed does)
    p = write("acc.json", '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,\n'
                          ' "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}\n')
    r = run("compare", CFG, "--deepspeed", p, "--quiet")
    check("stage 3 optimizer offload: exit 0, the row names zero3-opt-offload", r.returncode == 0 and
          "-> zero3-opt-offload" in r.stdout, r.stdout + r.stderr)
    r = run("compare", CFG, "--deepspeed", p, "--quiet", "--format", "json")
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    check("stage 3 optimizer offload json valid", not validate(doc), validate(doc))
    d = doc.get("deepspeed") or {}
    check("stage 3 optimizer offload json: priced, with a plan", d.get("plan_kind") == "zero3-opt-offload" and
          d.get("status") == "priced" and d.get("best") is not None, d)

    # --- ZeRO-3 without offload: zero3, priced with stage 3's hooks: slower than fsdp's row (the same Program without
    # them) in the same compare, and its table row present
    p = write("z3.json", '{"train_micro_batch_size_per_gpu": 2,\n "zero_optimization": {"stage": 3}}\n')
    r = run("compare", CFG, "--deepspeed", p, "--quiet", "--format", "json")
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    check("stage 3 without offload: exit 0, valid", r.returncode == 0 and not validate(doc), r.stderr + validate(doc))
    d = doc.get("deepspeed") or {}
    check("stage 3 without offload: zero3, priced, the hooks in the reasoning", d.get("plan_kind") == "zero3" and
          d.get("status") == "priced" and "hooks" in (d.get("reasoning") or ""), d)
    by_kind = {k.get("plan_kind"): k for k in doc.get("results", [])}
    t = [((by_kind.get(k) or {}).get("best") or {}).get("iteration_time_s") for k in ("fsdp", "zero3")]
    check("zero3 is fsdp plus host work: slower", None not in t and t[1] > t[0], t)

    # --- the pipelined optimizer swap (offload_optimizer pipeline_read / pipeline_write, NVMe only): the row takes
    # search.zero3's knobs, says so in its notes, and is faster than the same config swapping in series, on a
    # machine with drives (the MLP-Offload validation config, shortened to 8 layers)
    nvme_cfg = "configs/validation/unseen/mlpo-llama-h100.yaml"
    rows = {}
    for piped in (False, True):
        extra = ', "pipeline_read": true, "pipeline_write": true' if piped else ""
        p = write(f"nvme{int(piped)}.json", '{"train_micro_batch_size_per_gpu": 1,\n'
                  ' "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"'
                  + extra + '}}}\n')
        r = run("compare", nvme_cfg, "--set", "model.analytic.layers=8", "--deepspeed", p, "--quiet", "--format",
                "json")
        doc = json.loads(r.stdout) if r.returncode == 0 else {}
        check(f"pipelined {piped}: exit 0, valid", r.returncode == 0 and not validate(doc), r.stderr + validate(doc))
        rows[piped] = doc.get("deepspeed") or {}
    notes = " ".join(rows[True].get("notes") or [])
    check("pipelined: the notes say the I/O overlaps the CPU Adam", "pipeline_read: the update's NVMe read overlaps"
          in notes and "pipeline_write" in notes, rows[True])
    t = [(rows[k].get("best") or {}).get("iteration_time_s") for k in (False, True)]
    check("pipelined: zero3-opt-offload, priced, faster than in series", rows[True].get("plan_kind") ==
          "zero3-opt-offload" and None not in t and t[1] < t[0], t)

    # --- a micro-batch the model has no costs at: priced as not fitting, saying why (not "memory")
    p = write("big.json", '{"train_micro_batch_size_per_gpu": 16,\n'
                          ' "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}\n')
    r = run("compare", CFG, "--deepspeed", p, "--quiet", "--format", "json")
    d = (json.loads(r.stdout) if r.returncode == 0 else {}).get("deepspeed") or {}
    check("micro 16: exit 0, not feasible, why", r.returncode == 0 and d.get("feasible") is False and
          "outside the microbatch sizes the model is costed at (up to 9)" in (d.get("reason") or ""), r.stderr + str(d))

    # --- NVMe offload on a machine without an NVMe tier: the row says why
    r = run("compare", "configs/examples/gpt2_medium_search.yaml", "--set", "cost_model=native", "--deepspeed",
            "configs/deepspeed/zero3_offload_nvme.json", "--quiet")
    check("no nvme tier: exit 0, the row says why", r.returncode == 0 and
          "the DeepSpeed config offloads to NVMe (search.offload: nvme), but machine 'paper-1080ti' has no "
          "topology.nvme" in r.stdout, r.stdout + r.stderr)

    # --- "auto" in the batch keys takes plan.minibatch (here overridden by --set) and says so
    p = write("auto.json", '{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,\n'
                           ' "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}\n')
    r = run("compare", CFG, "--deepspeed", p, "--quiet", "--set", "plan.minibatch=8")
    check("auto: exit 0", r.returncode == 0, r.stderr)
    check("auto: says where the value came from", "train_batch_size: auto -> 8 (plan.minibatch" in r.stdout, r.stdout)
    check("auto: micro 2 x accum 2 x 2 GPUs", "micro 2 x accum 2 x 2 GPUs" in r.stdout, r.stdout)

    # --- fp16/bf16 become the analytic model's dtype: inside model.analytic, or beside model.hf_config
    ds = write("fp16.json", '{"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true},\n'
                            ' "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}\n')
    search = "search: {packing_fwd: [balanced_time], packing_bwd: [balanced_time]}\n"
    plan = "machine: a100-pcie-8x\ncost_model: native\nplan: {mode: harmony-pp, gpus: 2, minibatch: 8}\n" + search
    analytic = write("analytic.yaml", "model: {analytic: {preset: gpt2-small, ubatch_sizes: [1, 2, 4]}}\n" + plan)
    with open(os.path.join(ROOT, "configs/models/qwen2-7b/config.json")) as f:
        write("config.json", f.read())
    hf = write("hf.yaml", "model: {hf_config: config.json, seq_len: 512, ubatch_sizes: [1, 2]}\n" + plan)
    for cfg, key in [(analytic, "model.analytic.dtype=fp16"), (hf, "model.dtype=fp16")]:
        r = run("compare", cfg, "--deepspeed", ds, "--quiet", "--format", "json")
        check(f"{key}: exit 0", r.returncode == 0, r.stderr)
        d = (json.loads(r.stdout) if r.returncode == 0 else {}).get("deepspeed") or {}
        check(f"{key}: the dtype override", key in d.get("overrides", []) and d.get("dtype") == "fp16", d)
        check(f"{key}: priced", d.get("feasible") is True, d)

    # --- bad files: exit 2, file:line:column, a hint
    BAD = [
        ("inconsistent batch", '{\n  "train_batch_size": 32,\n  "train_micro_batch_size_per_gpu": 4,\n'
                               '  "gradient_accumulation_steps": 2\n}\n', 2, 23,
         "train_batch_size 32 is not train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x 2 GPUs"),
        ("unknown key", '{"train_micro_batch_size_per_gpu": 4,\n "zero_optimisation": {"stage": 3}}\n', 2, 2,
         "did you mean 'zero_optimization'?"),
        ("unmodelled feature", '{"train_micro_batch_size_per_gpu": 4,\n "pipeline": {"stages": 2}}\n', 2, 2,
         "pipeline is not modelled"),
        ("bad device", '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3,\n'
                       '  "offload_param": {"device": "gpu"}}}\n', 2, 31, "must be \"none\", \"cpu\" or \"nvme\""),
        ("malformed", '{"train_micro_batch_size_per_gpu": 4,}\n', 1, 38, "malformed JSON"),
    ]
    for what, text, line, col, message in BAD:
        p = write("bad.json", text)
        r = run("compare", CFG, "--deepspeed", p, "--quiet")
        check(f"{what}: exit 2", r.returncode == 2, r.stdout + r.stderr)
        check(f"{what}: at {line}:{col}", r.stderr.startswith(f"{p}:{line}:{col}: error: "), r.stderr)
        check(f"{what}: message", message in r.stderr, r.stderr)
        check(f"{what}: hint", "hint:" in r.stderr, r.stderr)
        check(f"{what}: nothing on stdout", r.stdout == "", r.stdout)
    r = run("compare", CFG, "--deepspeed", os.path.join(tmp, "missing.json"), "--quiet")
    check("missing file: exit 2 naming it", r.returncode == 2 and "missing.json" in r.stderr, r.stderr)

finish()
