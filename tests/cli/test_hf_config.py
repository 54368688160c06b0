#!/usr/bin/env python3
"""End-to-end tests of `model: {hf_config: PATH}` (a Hugging Face config.json as an analytic model) through
harmony-sim: the README's compare of the bundled Qwen2-7B config (every plan kind, JSON output naming the model),
a sweep whose grid lists an hf_config model (seq_len beside it overriding the file's context) and an analytic one,
resumed after the config.json changes (the rows that read it are recomputed), and bad files: exit 2 with the
config.json's file:line:column and a hint."""
import json
import os
import shutil
import sys
import tempfile

from clitest import PLAN_KINDS, ROOT, check, finish, runner, write

BIN = sys.argv[1]
QWEN = os.path.join(ROOT, "configs/models/qwen2-7b/config.json")
run = runner(BIN)

# --- the README's example: compare on a preset machine
r = run("compare", "configs/models/qwen2-7b/compare.yaml", "--format", "json")
check("compare exit 0", r.returncode == 0, r.stdout + r.stderr)
doc = json.loads(r.stdout) if r.returncode == 0 else {}
check("compare names the model from its folder", doc.get("model_name") == "qwen2-7b", str(doc)[:500])
kinds = {k.get("plan_kind"): k for k in doc.get("results", [])}
check("compare: every plan kind", sorted(kinds) == sorted(PLAN_KINDS), list(kinds))
check("compare: harmony-pp fits", kinds.get("harmony-pp", {}).get("feasible") is True, kinds.get("harmony-pp"))

with tempfile.TemporaryDirectory() as tmp:
    # --- a sweep over hf_config models (paths relative to the base config's folder)
    shutil.copy(QWEN, os.path.join(tmp, "qwen.json"))
    write(os.path.join(tmp, "base.yaml"),
          "model: {hf_config: qwen.json, seq_len: 2048, kernels: flash, ubatch_sizes: [1, 2, 4]}\n"
          "machine: h100-sxm-8x\ncost_model: native\nplan: {mode: harmony-pp, gpus: 8, minibatch: 32}\n"
          "search: {packing_fwd: [balanced_time], packing_bwd: [balanced_time]}\n")
    sweep = write(os.path.join(tmp, "sweep.yaml"),
                  "base: base.yaml\ngrid:\n  model:\n"
                  "    - {hf_config: qwen.json, seq_len: 2048, kernels: flash, ubatch_sizes: [1, 2, 4]}\n"
                  "    - {analytic: {preset: llama2-7b, seq_len: 1024, kernels: flash, ubatch_sizes: [1, 2, 4]}}\n"
                  "  plan.gpus: [8]\nkinds: [harmony-pp, zero-infinity]\n")
    r = run("sweep", sweep, "--out", os.path.join(tmp, "out2"), "--quiet")
    check("sweep exit 0", r.returncode == 0, r.stdout + r.stderr)
    rows = [json.loads(line) for line in open(os.path.join(tmp, "out2", "results.jsonl"))] if r.returncode == 0 else []
    check("sweep: 4 rows", len(rows) == 4, rows)
    by_model = {}
    for row in rows:
        by_model.setdefault(row.get("model_name"), []).append(row)
    check("sweep: the hf_config model, named from its file", set(by_model) == {"qwen", "llama2-7b"}, list(by_model))
    check("sweep: all ok", all(row.get("status") == "ok" for row in rows), [row.get("status") for row in rows])
    before = {row["point"]: row["inputs"] for row in rows}
    # an edited config.json: resume recomputes the rows that read it, keeps the others
    text = open(os.path.join(tmp, "qwen.json")).read().replace('"num_hidden_layers": 28', '"num_hidden_layers": 24')
    write(os.path.join(tmp, "qwen.json"), text)
    r = run("sweep", sweep, "--out", os.path.join(tmp, "out2"), "--quiet")
    check("resume exit 0", r.returncode == 0, r.stdout + r.stderr)
    check("resume recomputes the 2 hf rows", "2 computed" in r.stdout, r.stdout)
    after = [json.loads(line) for line in open(os.path.join(tmp, "out2", "results.jsonl"))]
    changed = sorted(row["point"] for row in after if before.get(row["point"]) != row["inputs"])
    check("resume: new inputs hashes for the hf rows only", changed == [0, 1], changed)

    # --- bad files: exit 2, the config.json's line:column, a hint
    def bad(name, text, loc, words):
        path = write(os.path.join(tmp, name + ".json"), text)
        cfg = write(os.path.join(tmp, name + ".yaml"),
                    f"model: {{hf_config: {name}.json}}\nmachine: h100-sxm-8x\n"
                    "plan: {mode: harmony-pp, gpus: 2, minibatch: 16}\n")
        r = run("search", cfg)
        check(f"{name}: exit 2", r.returncode == 2, f"rc={r.returncode} {r.stdout} {r.stderr}")
        check(f"{name}: location", f"{path}:{loc}: error:" in r.stderr, r.stderr)
        check(f"{name}: hint", "hint:" in r.stderr, r.stderr)
        for w in words:
            check(f"{name}: says {w!r}", w in r.stderr, r.stderr)

    qwen = open(QWEN).read()
    bad("moe", qwen.replace('"max_window_layers": 28,', '"max_window_layers": 28,\n  "num_experts": 64,'),
        "14:3", ["mixture-of-experts"])
    bad("model_type", qwen.replace('"qwen2"', '"qwen2_moe"'), "14:17", ["qwen2_moe", "gpt2, gpt_neox, llama"])
    bad("heads", qwen.replace('"num_key_value_heads": 4', '"num_key_value_heads": 5'), "17:26",
        ["does not divide num_attention_heads = 28"])
    bad("truncated", qwen[:200], "10:23", ["malformed JSON", "end of input"])
    cfg = write(os.path.join(tmp, "missing.yaml"),
                "model: {hf_config: nowhere/config.json}\nplan: {mode: harmony-pp, gpus: 2, minibatch: 16}\n")
    r = run("search", cfg)
    check("missing file: exit 2 at the config's hf_config value",
          r.returncode == 2 and f"{cfg}:1:20: error: cannot read model.hf_config" in r.stderr, r.stderr)

finish()
