#!/usr/bin/env python3
"""harmony-run trains the Llama-family block end to end (issue 36): configs/run/llama.yaml trains (the loss falls),
the same losses under a swapping baseline, fp32 and bf16, a tied head; the oracle's Hugging Face folder (tests/data/llama_tiny:
config.json with model_type llama + model.safetensors) loads through model.weights and --save-weights writes its
tensors back under their HF names with config.json beside them (a folder that trains on); a sharded folder
(model.safetensors.index.json) trains to the single file's losses; checkpoints: 3 steps + --resume to 6 give the
straight run's losses and weights bit for bit, and a resume under another shape exits 2 naming the field; bad
model.llama keys exit 2 naming the key.
Arguments: the harmony-run path."""
import json
import os
import shutil
import struct
import sys
import tempfile

from clitest import ROOT, check, finish, runner

RUN = sys.argv[1]
LLAMA = os.path.join(ROOT, "configs/run/llama.yaml")
TINY = os.path.join(ROOT, "tests/data/llama_tiny")
run = runner(RUN, timeout=300)


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def split_into_shards(src, folder, parts):
    """src's tensors in data order over PARTS shard files in FOLDER, and the index save_pretrained writes."""
    os.makedirs(folder, exist_ok=True)
    header = read_header(src)
    with open(src, "rb") as f:
        f.seek(8 + struct.unpack("<Q", open(src, "rb").read(8))[0])
        data = f.read()
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    per = -(-len(names) // parts)
    weight_map = {}
    for s in range(parts):
        file = f"model-{s + 1:05d}-of-{parts:05d}.safetensors"
        head, body = {"__metadata__": {"format": "pt"}}, b""
        for name in names[s * per:(s + 1) * per]:
            b, e = header[name]["data_offsets"]
            head[name] = {"dtype": header[name]["dtype"], "shape": header[name]["shape"],
                          "data_offsets": [len(body), len(body) + e - b]}
            body += data[b:e]
            weight_map[name] = file
        text = json.dumps(head).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(folder, file), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + body)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, f, indent=2)


def losses(proc):
    return [json.loads(line)["loss"] for line in proc.stdout.splitlines() if line.startswith("{") and '"loss"' in line]


def json_losses(proc):
    out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") and "\n{" not in proc.stdout else None
    if out is not None and "steps" in out:
        return [s["loss"] for s in out["steps"]]
    return losses(proc)


base = run("train", LLAMA, "--steps", "6", "--format", "json", "--quiet")
check("llama trains", base.returncode == 0, base.stderr[-400:])
got = json_losses(base)
check("six losses", len(got) == 6, base.stdout[:400])
if len(got) == 6:
    check("the loss falls", got[-1] < got[0] - 0.1, got)
    swap = run("train", LLAMA, "--steps", "6", "--format", "json", "--quiet", "--set", "plan.mode=dp-swap",
               "--gpu-memory", "4MiB")
    other = json_losses(swap)
    check("dp-swap trains", swap.returncode == 0 and len(other) == 6, swap.stderr[-400:])
    if len(other) == 6:
        check("dp-swap's losses match harmony-pp's", all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(got, other)),
              (got, other))
    tied = [run("train", LLAMA, "--steps", "4", "--format", "json", "--quiet", "--set",
                "model.llama.tie_embeddings=true", *extra) for extra in ([], ["--set", "plan.mode=l2l"])]
    t0, t1 = json_losses(tied[0]), json_losses(tied[1])
    check("a tied head trains", all(t.returncode == 0 for t in tied) and len(t0) == 4 and len(t1) == 4,
          tied[0].stderr[-300:] + tied[1].stderr[-300:])
    if len(t0) == 4 and len(t1) == 4:
        check("tied: l2l's losses match harmony-pp's", all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(t0, t1)),
              (t0, t1))
        check("tied and untied heads differ", t0[1] != got[1], (t0, got))
    bf16 = run("train", LLAMA, "--steps", "6", "--format", "json", "--quiet", "--dtype", "bf16")
    low = json_losses(bf16)
    check("bf16 trains", bf16.returncode == 0 and len(low) == 6, bf16.stderr[-400:])
    if len(low) == 6:
        check("bf16 stays near fp32", all(abs(a - b) <= 0.05 for a, b in zip(got, low)), (got, low))

with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "hub.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {{weights: '{TINY}', seq_len: 16}}\n"
                "machine: {preset: cpu-4x, gpu_memory: 8MiB}\n"
                "plan: {mode: harmony-pp, gpus: 2, minibatch: 4, u_fwd: 1, u_bwd: 1, pack_size: 2}\n"
                "train: {steps: 2, data: {synthetic_tokens: 4096, seed: 1}}\n")
    with open(os.path.join(TINY, "config.json")) as f:
        tiny_cfg = json.load(f)
    tuned = os.path.join(tmp, "tuned")
    os.mkdir(tuned)
    out = os.path.join(tuned, "model.safetensors")
    hub = run("train", cfg, "--save-weights", out, "--quiet", "--format", "json")
    check("the HF Llama folder trains", hub.returncode == 0, hub.stderr[-400:])
    if hub.returncode == 0:
        header = read_header(out)
        want = read_header(os.path.join(TINY, "model.safetensors"))
        names = sorted(k for k in header if k != "__metadata__")
        check("--save-weights writes the HF names", names == sorted(k for k in want if k != "__metadata__"), names[:4])
        with open(os.path.join(tuned, "config.json")) as f:
            saved_cfg = json.load(f)
        check("--save-weights writes config.json beside the weights, with the folder's keys",
              all(saved_cfg.get(k) == v for k, v in tiny_cfg.items()), saved_cfg)
        # the saved folder trains on from where the run stopped: its first loss is below the oracle folder's
        again = os.path.join(tmp, "again.yaml")
        with open(again, "w") as f:
            f.write(open(cfg).read().replace(TINY, tuned))
        r = run("train", again, "--quiet", "--format", "json")
        check("the saved folder (model.weights: its folder) trains", r.returncode == 0, r.stderr[-400:])
        if r.returncode == 0:
            first, resumed = json_losses(hub), json_losses(r)
            check("the saved folder holds the trained weights", resumed[0] < first[0], (first, resumed))

    # a sharded folder (model.safetensors.index.json + 3 shards, as save_pretrained writes big models) trains to the
    # same losses bit for bit as the single file
    shards = os.path.join(tmp, "sharded")
    split_into_shards(os.path.join(TINY, "model.safetensors"), shards, 3)
    shutil.copy(os.path.join(TINY, "config.json"), shards)
    sharded_cfg = os.path.join(tmp, "sharded.yaml")
    with open(sharded_cfg, "w") as f:
        f.write(open(cfg).read().replace(TINY, shards))
    one = run("train", cfg, "--quiet", "--format", "json")
    three = run("train", sharded_cfg, "--quiet", "--format", "json")
    check("the sharded folder trains", three.returncode == 0, three.stderr[-400:])
    check("sharded and single-file losses are the same bit for bit",
          one.returncode == 0 and json_losses(one) == json_losses(three) and len(json_losses(one)) == 2,
          (json_losses(one), json_losses(three)))
    os.remove(os.path.join(shards, "model-00002-of-00003.safetensors"))
    r = run("train", sharded_cfg, "--quiet")
    check("a missing shard: exit 2 naming the index, the shard and the fix", r.returncode == 2 and
          "model.safetensors.index.json:" in r.stderr and "model-00002-of-00003.safetensors" in r.stderr and
          "download every shard" in r.stderr, (r.returncode, r.stderr[-400:]))
    # Mistral: a sliding_window below seq_len is not modelled, and said so by name before any work
    mistral = os.path.join(tmp, "mistral")
    os.mkdir(mistral)
    shutil.copy(os.path.join(TINY, "model.safetensors"), mistral)
    with open(os.path.join(mistral, "config.json"), "w") as f:
        json.dump(dict(tiny_cfg, model_type="mistral", sliding_window=8), f)
    mcfg = os.path.join(tmp, "mistral.yaml")
    with open(mcfg, "w") as f:
        f.write(open(cfg).read().replace(TINY, mistral))
    r = run("train", mcfg, "--quiet")
    check("mistral, sliding_window 8 < seq_len 16: exit 2 naming it", r.returncode == 2 and "sliding_window 8" in
          r.stderr and "mistral.yaml:" in r.stderr and "does not model" in r.stderr, (r.returncode, r.stderr[-400:]))
    r = run("train", mcfg, "--quiet", "--set", "model.seq_len=8", "--format", "json")
    check("mistral, sliding_window 8 = seq_len: trains", r.returncode == 0, r.stderr[-400:])

    bad = os.path.join(tmp, "bad.yaml")
    with open(LLAMA) as f:
        text = f.read()
    with open(bad, "w") as f:
        f.write(text.replace("n_kv_head: 2", "n_kv_head: 3").replace("../machines/", os.path.join(ROOT, "configs/machines/")))
    r = run("train", bad, "--steps", "1")
    check("n_kv_head that does not divide n_head: exit 2", r.returncode == 2, r.returncode)
    check("the error names the key", "model.llama.n_kv_head" in r.stderr and "bad.yaml:" in r.stderr, r.stderr[-300:])
    with open(bad, "w") as f:
        f.write(text.replace("intermediate_size: 172", "").replace("../machines/",
                                                                   os.path.join(ROOT, "configs/machines/")))
    r = run("train", bad, "--steps", "1")
    check("missing intermediate_size: exit 2", r.returncode == 2 and "intermediate_size" in r.stderr, r.stderr[-300:])

    # checkpoints: 6 steps straight vs. 3 into a checkpoint directory + --resume to 6 give the same losses and the
    # same weights bit for bit (untied head; tied: the head's copy of the embedding comes back with it; bf16)
    for name, extra in (("untied", []), ("tied", ["--set", "model.llama.tie_embeddings=true"]),
                        ("bf16", ["--dtype", "bf16"])):
        ref_w, res_w = os.path.join(tmp, f"ref-{name}.safetensors"), os.path.join(tmp, f"res-{name}.safetensors")
        ck = os.path.join(tmp, f"ck-{name}")
        ref = run("train", LLAMA, "--steps", "6", "--format", "json", "--quiet", "--save-weights", ref_w, *extra)
        half = run("train", LLAMA, "--steps", "3", "--checkpoint-dir", ck, "--quiet", *extra)
        check(f"{name}: a Llama run saves a checkpoint", half.returncode == 0 and
              os.path.exists(os.path.join(ck, "step-000003.hckpt")), half.stderr[-400:])
        res = run("train", LLAMA, "--steps", "6", "--checkpoint-dir", ck, "--resume", "--format", "json", "--quiet",
                  "--save-weights", res_w, *extra)
        check(f"{name}: --resume exit 0", ref.returncode == 0 and res.returncode == 0, res.stderr[-400:])
        if ref.returncode == 0 and res.returncode == 0:
            a, b = json.loads(ref.stdout)["summary"], json.loads(res.stdout)["summary"]
            check(f"{name}: the resumed run starts at step 4", b["first_step"] == 4, b)
            check(f"{name}: 3 + resumed 3 steps: the same losses bit for bit", a["losses"] == b["losses"] and
                  len(a["losses"]) == 6, (a["losses"], b["losses"]))
            check(f"{name}: 3 + resumed 3 steps: the same weights bit for bit",
                  open(ref_w, "rb").read() == open(res_w, "rb").read())
    # a Llama checkpoint resumed under another shape: exit 2 naming the field, both values and the file
    ck = os.path.join(tmp, "ck-untied")
    for key, field, values in (("n_kv_head=4", "model.n_kv_head", "the checkpoint has 2, this run has 4"),
                               ("intermediate_size=128", "model.intermediate_size",
                                "the checkpoint has 172, this run has 128"),
                               ("tie_embeddings=true", "model.tie_embeddings",
                                "the checkpoint has false, this run has true")):
        r = run("train", LLAMA, "--steps", "8", "--checkpoint-dir", ck, "--resume", "--quiet", "--set",
                "model.llama." + key)
        check(f"resume with model.llama.{key}: exit 2 naming {field}", r.returncode == 2 and
              f"{field} differs: {values}" in r.stderr and "step-000006.hckpt:" in r.stderr, (r.returncode, r.stderr))
    r = run("train", LLAMA.replace("llama.yaml", "default.yaml"), "--steps", "1", "--checkpoint-dir", ck, "--resume",
            "--quiet")
    check("a GPT-2 run resuming a Llama checkpoint: exit 2 naming model.arch", r.returncode == 2 and
          "model.arch differs: the checkpoint has llama, this run has gpt2" in r.stderr, (r.returncode, r.stderr))

finish("test_run_llama: ")
