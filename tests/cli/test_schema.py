#!/usr/bin/env python3
"""Every JSON document and row of both tools against the committed JSON Schemas (schemas/, docs/output-schema.md):
harmony-sim simulate/search/compare (reference and native, a plan that does not fit, kinds that find nothing),
presets, sweep and merge summaries, report (a sweep folder and a config), a sweep's results.jsonl rows and sweep.json, and harmony-run train (a Harmony plan and a baseline). The
schemas are strict (additionalProperties false, every field required), so a field added, renamed or dropped in
the code without the schema fails here. Also: a sweep folder of an older results format is refused with the fix."""
import json
import os
import sys
import tempfile
import warnings

from clitest import PLAN_KINDS, ROOT, check, run as run_in_root, summary

try:
    import jsonschema
except ImportError:
    print("test_schema: python3-jsonschema is missing; install it with scripts/install-deps.sh", file=sys.stderr)
    sys.exit(1)

SIM = sys.argv[1]
RUN = sys.argv[2]
SCHEMAS = os.path.join(ROOT, "schemas")


def load_schemas():
    store = {}
    for name in sorted(os.listdir(SCHEMAS)):
        if name.endswith(".schema.json"):
            with open(os.path.join(SCHEMAS, name)) as f:
                store[name] = json.load(f)
    return store


STORE = load_schemas()


def validator(name):
    schema = STORE[name]
    with warnings.catch_warnings():  # RefResolver: deprecated in newer jsonschema, the one API every version has
        warnings.simplefilter("ignore", DeprecationWarning)
        resolver = jsonschema.RefResolver(base_uri=schema["$id"], referrer=schema,
                                          store={s["$id"]: s for s in STORE.values()})
        return jsonschema.Draft7Validator(schema, resolver=resolver)


def validate(what, name, doc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        errors = sorted(validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    check(f"{what} matches {name}", not errors,
          "; ".join(f"/{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:5]))


def strict(node, path="#"):
    """Every object schema in a file closes its properties and requires them (optional ones are listed)."""
    optional = {"rank", "rank_time_s", "tokens", "seq_len"}
    bad = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties") is not False:
                bad.append(f"{path}: additionalProperties is not false")
            missing = set(node["properties"]) - set(node.get("required", [])) - optional
            if missing:
                bad.append(f"{path}: not required: {sorted(missing)}")
        for k, v in node.items():
            bad += strict(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            bad += strict(v, f"{path}/{i}")
    return bad


def run(binary, *args, rc=0):
    r = run_in_root(binary, *args, timeout=600)
    ok = r.returncode == rc
    check(f"{os.path.basename(binary)} {' '.join(args)}: exit {rc}", ok, r.stderr[-1500:])
    return r


def sim_json(name, *args, rc=0):
    r = run(SIM, *args, "--format", "json", rc=rc)
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        check(f"{' '.join(args)}: JSON on stdout", False, f"{e}: {r.stdout[:300]}")
        return None
    validate(" ".join(args), name, doc)
    return doc


def main():
    # --- the schemas themselves: valid draft-07, strict
    for name, schema in STORE.items():
        try:
            jsonschema.Draft7Validator.check_schema(schema)
            check(f"{name} is a valid draft-07 schema", True)
        except jsonschema.SchemaError as e:
            check(f"{name} is a valid draft-07 schema", False, e.message)
        bad = strict(schema)
        check(f"{name} is strict", not bad, bad)
    for want in ["simulate", "search", "compare", "presets", "kinds", "sweep-row", "sweep-meta", "sweep-summary",
                 "merge-summary", "report", "harmony-run-train"]:
        check(f"schemas/{want}.schema.json exists", f"{want}.schema.json" in STORE, sorted(STORE))

    cfg = "configs/examples/bert_large_simulate.yaml"
    small = ["--set", "plan.minibatch=8", "--set", "plan.u_fwd=4", "--set", "plan.u_bwd=4"]
    tiny_search = ["--set", "search.packing_fwd=[balanced_time]", "--set", "search.packing_bwd=[balanced_time]"]

    # --- simulate: reference, native (its ledger, host memory), a plan that does not fit (fits false + excess)
    d = sim_json("simulate.schema.json", "simulate", cfg, *small)
    if d:
        r = d["result"]
        check("simulate: schema_version 1", d["schema_version"] == 1, d.get("schema_version"))
        check("simulate reference: native-only fields null",
              r["swap_ledger"] is None and r["host_memory"] is None and r["memory_overflow"] is None, r)
        check("simulate: packs as [first, last] pairs",
              all(isinstance(p, list) and len(p) == 2 and p[0] <= p[1] for p in r["packs_bwd"]), r["packs_bwd"])
        check("simulate: fits with a null excess", r["fits"] is True and r["excess_bytes"] is None, r)
    d = sim_json("simulate.schema.json", "simulate", cfg, *small, "--set", "cost_model=native")
    if d:
        check("simulate native: ledger and host memory", d["result"]["swap_ledger"] is not None and
              d["result"]["host_memory"]["total_bytes"] > 0, d["result"].get("host_memory"))
    d = sim_json("simulate.schema.json", "simulate", cfg, *small, "--set", "machine.gpu_memory=1GiB")
    if d:
        r = d["result"]
        check("1 GiB: fits false with the excess", r["fits"] is False and
              r["excess_bytes"] == r["peak_memory_bytes"] - r["gpu_capacity_bytes"], r)

    # --- search, compare (every kind; a GPU too small for anything: reasons, best null)
    d = sim_json("search.schema.json", "search", cfg, *small, *tiny_search)
    if d:
        check("search: ranked results", len(d["results"]) > 0 and d["results"][0]["rank"] == 1, d["results"][:1])
    d = sim_json("compare.schema.json", "compare", cfg, *small, *tiny_search)
    if d:
        kinds = [x["plan_kind"] for x in d["results"]]
        check("compare: every plan kind once", sorted(kinds) == sorted(
            PLAN_KINDS), kinds)
        check("compare: a baseline's best names its own kind, not a Harmony mode",
              all(x["best"] is None or x["best"]["plan_kind"] == x["plan_kind"] for x in d["results"]), kinds)
    d = sim_json("compare.schema.json", "compare", cfg, *small, *tiny_search, "--set", "machine.gpu_memory=64MiB",
                 "--set", "cost_model=native")
    if d:
        check("compare 64 MiB: nothing fits, best null with a reason",
              all(not x["feasible"] and x["best"] is None and x["reason"] for x in d["results"]), d["results"])

    # --- compare --deepspeed: the deepspeed object (tests/cli/test_deepspeed.py: the rest)
    d = sim_json("compare.schema.json", "compare", "configs/deepspeed/gpt2_medium.yaml", "--deepspeed",
                 "configs/deepspeed/zero3_offload_cpu.json")
    if d:
        check("compare --deepspeed: the deepspeed object", (d.get("deepspeed") or {}).get("plan_kind") == "zero-infinity",
              d.get("deepspeed"))

    # --- presets
    d = sim_json("presets.schema.json", "presets")
    if d:
        check("presets: the built-in machines", any(p["machine_name"] == "paper-1080ti" for p in d["presets"]),
              [p["machine_name"] for p in d["presets"]])

    # --- kinds: the registry in listing order, the outputs' plan_kind enum
    d = sim_json("kinds.schema.json", "kinds")
    if d:
        check("kinds: every registered kind in listing order", [k["name"] for k in d["kinds"]] == PLAN_KINDS,
              [k["name"] for k in d["kinds"]])
        roles = {k["name"]: k["role"] for k in d["kinds"]}
        check("kinds: roles", roles.get("harmony-pp") == "harmony" and roles.get("dp-swap") == "baseline" and
              roles.get("resident") == "ceiling", roles)
        # a refused kind names the trained kind with its updates (harmony-run's hint); a trained kind names none
        trains = {k["name"]: k["trains"] for k in d["kinds"]}
        trains_as = {k["name"]: k["trains_as"] for k in d["kinds"]}
        check("kinds: trains_as names a kind that trains, for the refused kinds only",
              all((trains_as[n] is None) == trains[n] and (trains_as[n] is None or trains.get(trains_as[n]))
                  for n in trains), trains_as)
        check("kinds: harmony-run trains host-stream (its device updates over host state)",
              trains.get("host-stream") is True, trains)

    with tempfile.TemporaryDirectory() as tmp:
        # --- sweep: every row and sweep.json (a grid with invalid points and a grid key that is a result column)
        sweep = os.path.join(tmp, "tiny.yaml")
        with open(sweep, "w") as f:
            f.write(f"""base: {os.path.abspath(os.path.join(ROOT, cfg))}
set:
  plan.minibatch: 8
  search.packing_fwd: [balanced_time]
  search.packing_bwd: [balanced_time]
grid:
  cost_model: [reference, native]
  plan.gpus: [1, 9]
kinds: [harmony-pp, dp-swap, l2l]
budget: {{samples: 1000}}
""")
        out = os.path.join(tmp, "out")
        d = sim_json("sweep-summary.schema.json", "sweep", sweep, "--out", out, "--quiet", "--threads", "2")
        if d:
            check("sweep summary: totals", d["points"] == 12 and d["done"] == 12 and
                  sum(d["by_status"].values()) == 12, d)
        # shards and their merge: the same rows, a merge summary
        for i in range(2):
            sim_json("sweep-summary.schema.json", "sweep", sweep, "--out", os.path.join(tmp, f"s{i}"), "--shard",
                     f"{i}/2", "--quiet", "--threads", "1")
        d = sim_json("merge-summary.schema.json", "merge", os.path.join(tmp, "merged"), os.path.join(tmp, "s0"),
                     os.path.join(tmp, "s1"))
        if d:
            check("merge summary", d["shards"] == 2 and d["points"] == 12, d)
        with open(os.path.join(tmp, "merged", "sweep.json")) as f:
            validate("merged sweep.json", "sweep-meta.schema.json", json.load(f))
        with open(os.path.join(tmp, "merged", "results.jsonl")) as f, open(os.path.join(out, "results.jsonl")) as g:
            check("merged rows = unsharded rows", f.read() == g.read(), "")
        with open(os.path.join(out, "results.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        check("sweep: 12 rows", len(rows) == 12, len(rows))
        for row in rows:
            validate(f"sweep row {row.get('point')}", "sweep-row.schema.json", row)
        ok = [r for r in rows if r["status"] == "ok"]
        check("sweep: ok rows have fits and packs arrays", ok and all(
            isinstance(r["fits"], bool) and isinstance(r["packs_bwd"], list) for r in ok), ok[:1])
        check("sweep: the cost_model grid key is the cost_model column",
              sorted({r["cost_model"] for r in rows}) == ["native", "reference"], {r["cost_model"] for r in rows})
        check("sweep: invalid rows are null, not 0", all(r["iteration_time_s"] is None and r["fits"] is None
                                                          for r in rows if r["status"] == "invalid"), rows)
        with open(os.path.join(out, "sweep.json")) as f:
            validate("sweep.json", "sweep-meta.schema.json", json.load(f))

        # --- report --format json (a sweep folder and a config): the page and traces it names are written
        page = os.path.join(tmp, "rep.html")
        d = sim_json("report.schema.json", "report", out, "--out", page)
        if d:
            check("report json: a sweep, the page it wrote", d["input"] == "sweep" and d["out_path"] == page and
                  d["page_bytes"] == os.path.getsize(page), d)
            best = [m for m in d["models"] if m["best"] is not None]
            check("report json: each best plan's trace exists", best and all(
                os.path.isfile(m["trace_path"]) and m["best_note"] is None for m in best), d["models"])
        d = sim_json("report.schema.json", "report", cfg, *small, *tiny_search, "--out", os.path.join(tmp, "c.html"))
        if d:
            check("report json: a config, one model, its best plan", d["input"] == "config" and
                  len(d["models"]) == 1 and d["models"][0]["best"]["plan_kind"] in PLAN_KINDS, d["models"])

        # --- a folder of an older results format: refused, naming the fix
        with open(os.path.join(out, "sweep.json")) as f:
            meta = json.load(f)
        meta["version"] = 2
        del meta["schema_version"]
        with open(os.path.join(out, "sweep.json"), "w") as f:
            json.dump(meta, f)
        r = run(SIM, "sweep", sweep, "--out", out, "--quiet", "--format", "json", rc=2)
        check("older sweep folder: the error names the format and the fix",
              "sweep format 2" in r.stderr and "new --out folder" in r.stderr and r.stdout == "", r.stderr)
        r = run(SIM, "report", out, "--out", os.path.join(tmp, "r.html"), rc=2)
        check("older sweep folder: report refuses it too", "sweep format 2" in r.stderr, r.stderr)

        # --- harmony-run train: a Harmony plan and a baseline (packs null)
        for extra, what in [([], "harmony-pp"), (["--set", "plan.mode=dp-swap", "--set", "plan.gpus=2"], "dp-swap")]:
            r = run(RUN, "train", "configs/run/default.yaml", "--steps", "1", "--format", "json", *extra)
            try:
                doc = json.loads(r.stdout)
            except json.JSONDecodeError as e:
                check(f"train {what}: JSON", False, f"{e}: {r.stdout[:300]}")
                continue
            validate(f"train {what}", "harmony-run-train.schema.json", doc)
            check(f"train {what}: plan_kind", doc["plan"]["plan_kind"] == what, doc["plan"])
            if what == "dp-swap":
                check("baseline run: packs null", doc["plan"]["packs_fwd"] is None, doc["plan"])
        # the prediction beside the measurement: numbers, or null when none could be made; never absent
        doc["summary"]["predicted_step_time_s"] = 0.5
        doc["summary"]["prediction_error"] = None
        validate("train with predicted_step_time_s", "harmony-run-train.schema.json", doc)
        del doc["summary"]["prediction_error"]
        check("prediction_error is required",
              len(list(validator("harmony-run-train.schema.json").iter_errors(doc))) > 0, "")
        doc["summary"]["prediction_error"] = None
        doc["summary"]["unknown_field"] = 1
        errors = list(validator("harmony-run-train.schema.json").iter_errors(doc))
        check("an unknown field fails the schema", len(errors) > 0, "")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
