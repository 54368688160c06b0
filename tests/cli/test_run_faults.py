#!/usr/bin/env python3
"""harmony-run's reliability cases of issue 32, end to end:
- host memory: a run over the process's RLIMIT_AS or RLIMIT_DATA is refused before any allocation (exit 2 with the
  numbers and the limit), and an allocation that fails all the same exits 2 naming what was being allocated;
- the checkpoint folder is locked: a second run (fresh or --resume) into the folder of a running one exits 2
  naming the holder, and the first run's checkpoints survive and resume;
- non-finite training stops at the first NaN/infinite loss or gradient with exit 3, naming the step, keeping the
  checkpoints saved before it and writing nothing of the poisoned state; a diverging loss is warned about; loaded
  weights that are not finite are refused at load naming the tensor;
- messages: CLI11's parse errors in the `error:` + `hint:` format (both tools), a unitless --gpu-memory, --data
  errors named after --data, the missing-profile hint;
- output: `--format json` keeps progress on stderr, `--quiet` keeps the results, --version loads no CUDA library
  and `device: cuda` loads the CUDA module on demand.
Every child starts with SIGINT, SIGTERM, SIGHUP, SIGPIPE and SIGXFSZ at their default disposition.
Arguments: harmony-run and harmony-sim paths."""
import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time

import clitest
from clitest import ROOT, SANITIZED, check, finish, run as run_in_root

RUN = sys.argv[1]
SIM = sys.argv[2]
DEFAULT = os.path.join(ROOT, "configs/run/default.yaml")
TINY = os.path.join(ROOT, "tests/data/gpt2_tiny")
# ASan and UBSan map terabytes of shadow memory: an address-space or data limit of a GiB stops such a build at
# start, so the sanitizer tree (tests/meson.build sets HARMONY_SANITIZED) skips the rlimit cases.
KERNEL_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ]


def child_setup(limits=()):
    """preexec_fn: default signal dispositions (whatever meson or the shell set), then the given rlimits."""
    def setup():
        for s in KERNEL_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        for resource_id, value in limits:
            resource.setrlimit(resource_id, (value, value))
    return setup


def run(*args, binary=RUN, timeout=120, limits=(), env=None):
    return run_in_root(binary, *args, timeout=timeout, preexec_fn=child_setup(limits), env=env)


def popen(*args, **kw):
    return subprocess.Popen([RUN, *args], cwd=ROOT, preexec_fn=child_setup(), text=True, **kw)


def checkpoints(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".hckpt")) if os.path.isdir(d) else []


def error_format(r, tool="harmony-run"):  # "TOOL: error: ..." or "TOOL COMMAND: error: ...", then a hint line
    return re.search(rf"^{re.escape(tool)}( [a-z]+)?: error: ", r.stderr, re.M) is not None and \
        "\n  hint: " in r.stderr


GiB = 1 << 30
# ~100 M parameters: 1.5 GiB of host state (weights, gradients, AdamW moments) at n_embd 1024
BIG = ["--set", "model.gpt2.n_embd=1024", "--steps", "1"]


def test_host_memory(tmp):
    # --- RLIMIT_AS (ulimit -v) and RLIMIT_DATA (ulimit -d) of 1 GiB: refused before anything is allocated
    for rid, name in [(resource.RLIMIT_AS, "RLIMIT_AS (ulimit -v)"), (resource.RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)")]:
        t0 = time.time()
        r = run("train", DEFAULT, *BIG, limits=[(rid, GiB)])
        check(f"{name} 1 GiB: exit 2 before allocating", r.returncode == 2 and name in r.stderr and
              "the run needs 1.5" in r.stderr and "this process may allocate " in r.stderr and
              "nothing was allocated" in r.stderr and error_format(r, DEFAULT), (r.returncode, r.stderr))
        check(f"{name}: refused at once", time.time() - t0 < 20, time.time() - t0)
    # --plan auto profiles and trial-steps scratch copies of the model: the floor is checked before the search
    r = run("train", DEFAULT, *BIG, "--plan", "auto", limits=[(resource.RLIMIT_AS, GiB)])
    check("--plan auto under RLIMIT_AS: refused before the search", r.returncode == 2 and
          "RLIMIT_AS" in r.stderr and "profiling" not in r.stderr, (r.returncode, r.stderr))
    # `profile` allocates the model too
    r = run("profile", DEFAULT, "--out", os.path.join(tmp, "p.json"), "--set", "model.gpt2.n_embd=1024",
            limits=[(resource.RLIMIT_AS, GiB)])
    check("profile under RLIMIT_AS: exit 2 with the limit", r.returncode == 2 and "RLIMIT_AS" in r.stderr,
          (r.returncode, r.stderr))
    # the same run within the limit is not refused by the check (it only counts what the run needs)
    r = run("train", DEFAULT, "--steps", "1", "--quiet", limits=[(resource.RLIMIT_AS, GiB)])
    check("the default trains under RLIMIT_AS 1 GiB", r.returncode == 0, (r.returncode, r.stderr))
    # --- threads that cannot start (each maps its stack and a malloc arena): exit 2 with the limit, not a crash
    r = run("train", DEFAULT, "--steps", "1", "--quiet", limits=[(resource.RLIMIT_AS, 96 << 20)])
    check("RLIMIT_AS 96 MiB: exit 2 naming the limit", r.returncode == 2 and "RLIMIT_AS" in r.stderr and
          "internal error" not in r.stderr and error_format(r) or r.returncode == 2 and error_format(r, DEFAULT)
          and "RLIMIT_AS" in r.stderr, (r.returncode, r.stderr))
    # --- an allocation that fails all the same (the token file is read before a plan exists): exit 2 naming it
    sparse = os.path.join(tmp, "sparse_tokens.bin")
    with open(sparse, "wb") as f:
        f.truncate(3 * GiB // 2)
    r = run("train", DEFAULT, "--data", sparse, "--steps", "1", limits=[(resource.RLIMIT_AS, GiB)])
    check("bad_alloc reading 1.5 GiB of tokens under 1 GiB: exit 2 naming the file", r.returncode == 2 and
          "out of host memory" in r.stderr and sparse in r.stderr and "RLIMIT_AS" in r.stderr and
          "internal error" not in r.stderr and error_format(r), (r.returncode, r.stderr))
    os.remove(sparse)


def test_checkpoint_lock(tmp):
    ck = os.path.join(tmp, "locked")
    p = popen("train", DEFAULT, "--steps", "400", "--checkpoint-dir", ck, "--checkpoint-every", "1",
              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    head = ""
    for line in p.stderr:  # off a terminal the first step's progress line is always written
        head += line
        if line.startswith("step "):
            break
    try:
        for extra in [[], ["--resume"]]:
            r = run("train", DEFAULT, "--steps", "400", "--checkpoint-dir", ck, *extra)
            check(f"second run {extra} into a running run's checkpoint dir: exit 2 naming the holder",
                  r.returncode == 2 and "another harmony-run is writing checkpoints" in r.stderr and
                  f"pid {p.pid} on host" in r.stderr and "hint:" in r.stderr, (r.returncode, r.stderr))
        check("the refused runs wrote nothing: the first run still running", p.poll() is None, head)
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    check("the first run stops on SIGTERM with a checkpoint", p.returncode == 143 and len(checkpoints(ck)) >= 1,
          (p.returncode, head + err))
    # the lock went with the process: the run resumes, and its checkpoints are its own
    done = len(checkpoints(ck)) and int(checkpoints(ck)[-1][5:11])
    r = run("train", DEFAULT, "--steps", str(done + 1), "--checkpoint-dir", ck, "--resume", "--quiet")
    check("after the holder exits, --resume takes the lock and continues", r.returncode == 0 and
          checkpoints(ck)[-1] == f"step-{done + 1:06d}.hckpt", (r.returncode, r.stderr, checkpoints(ck)))


def test_nohup(tmp):
    # A SIGHUP ignored when the run starts (nohup) stays ignored: the run goes on, and a SIGTERM still stops it.
    ck = os.path.join(tmp, "nohup_ck")

    def ignore_hup():
        child_setup()()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    p = subprocess.Popen([RUN, "train", DEFAULT, "--steps", "400", "--checkpoint-dir", ck], cwd=ROOT,
                         preexec_fn=ignore_hup, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    head = ""
    for line in p.stderr:
        head += line
        if line.startswith("step "):
            break
    p.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    check("nohup: an ignored SIGHUP does not stop the run", p.poll() is None, head)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    check("nohup: SIGTERM still stops it with a checkpoint (143)", p.returncode == 143 and len(checkpoints(ck)) >= 1,
          (p.returncode, err[-2000:]))


def nan_weights(folder):
    """A copy of the tiny Hugging Face GPT-2 with element 3 of h.0.attn.c_attn.weight set to NaN."""
    os.makedirs(folder, exist_ok=True)
    data = bytearray(open(os.path.join(TINY, "model.safetensors"), "rb").read())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    t = header["h.0.attn.c_attn.weight"]
    assert t["dtype"] == "F32"
    at = 8 + n + t["data_offsets"][0] + 3 * 4
    data[at:at + 4] = struct.pack("<f", float("nan"))
    path = os.path.join(folder, "model.safetensors")
    open(path, "wb").write(bytes(data))
    return path


def test_nonfinite(tmp):
    # --- lr 1e20: the step-1 update makes the weights ~1e20 and step 2's loss NaN: exit 3 naming the step,
    # the step-1 checkpoint kept, no step-2 checkpoint, --save-weights and --trace not written
    ck = os.path.join(tmp, "nan_ck")
    w = os.path.join(tmp, "nan.safetensors")
    trace = os.path.join(tmp, "nan_trace.json")
    r = run("train", DEFAULT, "--steps", "5", "--set", "train.lr=1e20", "--checkpoint-dir", ck, "--checkpoint-every",
            "1", "--save-weights", w, "--trace", trace)
    check("NaN loss: exit 3", r.returncode == 3, (r.returncode, r.stderr))
    check("NaN loss: the message names the step, the loss and what is kept",
          "training stopped at step 2: the loss is NaN" in r.stderr and "step-000001.hckpt (step 1), is kept" in r.stderr
          and "train.lr (now 1e+20)" in r.stderr and error_format(r), r.stderr)
    check("NaN loss: only the checkpoint before it", checkpoints(ck) == ["step-000001.hckpt"], checkpoints(ck))
    check("NaN loss: --save-weights and --trace not written", not os.path.exists(w) and not os.path.exists(trace)
          and "not written: --save-weights" in r.stderr, r.stderr)
    check("NaN loss: no success summary", "done " not in r.stdout, r.stdout)
    # the kept checkpoint resumes (and diverges again: the same steps with the same settings)
    r = run("train", DEFAULT, "--steps", "5", "--set", "train.lr=1e20", "--checkpoint-dir", ck, "--resume", "--quiet")
    check("resuming it repeats the divergence: exit 3 at step 2 again, naming the checkpoint it resumed from",
          r.returncode == 3 and "stopped at step 2" in r.stderr and "step-000001.hckpt (step 1), is kept" in r.stderr,
          (r.returncode, r.stderr))
    # --format json: no document on stdout, the same exit code
    r = run("train", DEFAULT, "--steps", "5", "--set", "train.lr=1e20", "--format", "json")
    check("NaN loss with --format json: exit 3, stdout empty", r.returncode == 3 and r.stdout == "",
          (r.returncode, r.stdout[:200], r.stderr))
    # --- a diverging but finite run (lr 1e6: loss ~1e13) trains to the end with a warning
    r = run("train", DEFAULT, "--steps", "3", "--set", "train.lr=1e6", "--quiet")
    check("diverging run: exit 0 with a warning naming the step", r.returncode == 0 and
          "harmony-run: warning: step 2: the loss" in r.stderr and "the run is diverging" in r.stderr and
          "hint: lower train.lr" in r.stderr, (r.returncode, r.stderr))
    r = run("train", DEFAULT, "--steps", "3", "--quiet")
    check("a healthy run: no warning", r.returncode == 0 and "warning" not in r.stderr, r.stderr)
    # --- NaN in loaded weights: refused at load naming the tensor and the element
    nan = nan_weights(os.path.join(tmp, "nan_model"))
    cfg = os.path.join(tmp, "nan.yaml")
    open(cfg, "w").write(f"""model: {{weights: {nan}, n_head: 2, seq_len: 16}}
machine: {{preset: cpu-4x, gpu_memory: 1MiB}}
plan: {{mode: harmony-pp, gpus: 2, minibatch: 4, u_fwd: 2, u_bwd: 1, pack_size: 1}}
train: {{steps: 3, lr: 1e-3, data: {TINY}/tokens.bin}}
""")
    r = run("train", cfg)
    check("NaN weight: exit 2 at load naming the tensor", r.returncode == 2 and
          "tensor h.0.attn.c_attn.weight holds NaN at element 3" in r.stderr and nan in r.stderr and
          error_format(r, nan), (r.returncode, r.stderr))


def test_out_of_memory(tmp):
    """A step out of device memory: exit 2 at the config, the allocation, and a hint in the terms of the run's kind
    (packs only where the kind has them; keep's saved activations), naming the checkpoint the run keeps."""
    r = run("train", DEFAULT, "--steps", "2", "--gpu-memory", "600KiB")
    check("Harmony-PP out of memory: exit 2, the hint names packs", r.returncode == 2 and
          "does not fit the devices' memory" in r.stderr and "use smaller packs (plan.pack_size)" in r.stderr and
          "no checkpoint was written by this run" in r.stderr and error_format(r, DEFAULT), (r.returncode, r.stderr))
    r = run("train", DEFAULT, "--steps", "2", "--set", "plan.mode=dp-swap", "--set", "plan.gpus=1",
            "--gpu-memory", "400KiB")
    check("dp-swap out of memory: the hint names its microbatch, not packs", r.returncode == 2 and
          "use a smaller microbatch (plan.u_bwd)" in r.stderr and "pack" not in r.stderr, (r.returncode, r.stderr))
    # host-stream checkpointed at step 2, resumed under keep in 1 MiB: out of memory at step 3, the checkpoint kept
    ck = os.path.join(tmp, "oom_ck")
    one = ["--set", "plan.mode=host-stream", "--set", "plan.gpus=1", "--checkpoint-dir", ck]
    r = run("train", DEFAULT, "--steps", "2", *one, "--gpu-memory", "4MiB", "--checkpoint-every", "1", "--quiet")
    check("host-stream checkpointed at step 2", r.returncode == 0, r.stderr)
    r = run("train", DEFAULT, "--steps", "4", *one, "--set", "plan.activations=keep", "--gpu-memory", "1MiB",
            "--resume")
    check("host-stream under keep out of memory after a resume: the step, keep's fix and the checkpoint kept",
          r.returncode == 2 and "at step 3:" in r.stderr and "plan.activations: checkpoint" in r.stderr and
          "step-000002.hckpt (step 2), is kept as it was" in r.stderr and "pack" not in r.stderr,
          (r.returncode, r.stderr))
    check("host-stream out of memory: the checkpoints as they were", checkpoints(ck) == ["step-000001.hckpt",
                                                                                          "step-000002.hckpt"],
          checkpoints(ck))


def test_messages(tmp):
    # --- CLI11's errors in the error + hint format, both tools
    for binary, tool, args, words in [
            (RUN, "harmony-run", ["train"], "config is required"),
            (RUN, "harmony-run", ["train", DEFAULT, "--bogus"], "--bogus"),
            (RUN, "harmony-run", ["train", DEFAULT, "--steps", "0"], "--steps"),
            (RUN, "harmony-run", [], "subcommand"),
            (SIM, "harmony-sim", ["simulate"], "config is required"),
            (SIM, "harmony-sim", ["search", "configs/default.yaml", "--nope"], "--nope")]:
        r = run(*args, binary=binary)
        check(f"{tool} {' '.join(args)}: exit 2, error + hint", r.returncode == 2 and error_format(r, tool) and
              words in r.stderr and "--help" in r.stderr and "Run with --help" not in r.stderr,
              (r.returncode, r.stderr))
    r = run("--help")
    check("--help still exits 0", r.returncode == 0 and "train" in r.stdout, r.stderr)
    # --- a unitless --gpu-memory is refused (it would be bytes), with the fix
    r = run("train", DEFAULT, "--steps", "1", "--gpu-memory", "10")
    check("--gpu-memory 10: exit 2, a unit needed", r.returncode == 2 and "--gpu-memory 10: error:" in r.stderr and
          "needs a unit" in r.stderr and "10GiB" in r.stderr, (r.returncode, r.stderr))
    r = run("train", DEFAULT, "--steps", "1", "--quiet", "--gpu-memory", "1048576B")
    check("--gpu-memory with B trains", r.returncode == 0, r.stderr)
    # --- --data errors name --data, not --set train.data
    big = os.path.join(tmp, "oov.bin")
    open(big, "wb").write(bytes([0, 1] * 2000))  # token id 256 > vocab 256
    small = os.path.join(tmp, "few.bin")
    open(small, "wb").write(bytes([1, 0] * 20))
    for path, words in [(big, "vocabulary"), (small, "one minibatch")]:
        r = run("train", DEFAULT, "--data", path)
        check(f"--data {os.path.basename(path)}: the error names --data", r.returncode == 2 and
              f"--data {path}: error:" in r.stderr and "--set train.data" not in r.stderr and words in r.stderr,
              (r.returncode, r.stderr))
    # a path with YAML syntax in it is taken literally
    odd = os.path.join(tmp, "a: [b].bin")
    open(odd, "wb").write(bytes([1, 0] * 20))
    r = run("train", DEFAULT, "--data", odd)
    check("--data with YAML characters: read as a path", r.returncode == 2 and "one minibatch" in r.stderr,
          (r.returncode, r.stderr))
    # --- the missing-profile hint says where relative paths start: the config's folder
    r = run("train", DEFAULT, "--steps", "1", "--set", "model.profile=no_such_profile.json")
    check("missing profile: the hint names the config's folder", r.returncode == 2 and
          "configs/run/no_such_profile.json" in r.stderr and "the folder of the config" in r.stderr and
          "current directory" not in r.stderr, (r.returncode, r.stderr))
    # --- fsdp (sharded over the GPUs) named in the config file trains; its shards too large for the devices are a
    # located error naming the 1/N it keeps on each and the fix
    cfg = os.path.join(tmp, "fsdp.yaml")
    text = open(DEFAULT).read()
    mode = re.search(r"mode: *([a-z-]+)", text)
    with open(cfg, "w") as f:  # the machine as its preset: the copy is not beside configs/machines/
        f.write(text.replace(mode.group(0), "mode: fsdp", 1).replace("file: ../machines/cpu-4x.yaml", "preset: cpu-4x"))
    r = run("train", cfg, "--steps", "2", "--gpu-memory", "16MiB")
    check("plan.mode fsdp in the file trains", r.returncode == 0 and "fsdp N4" in r.stdout + r.stderr,
          (r.returncode, r.stdout, r.stderr))
    r = run("train", cfg, "--steps", "1", "--set", "plan.gpus=2", "--gpu-memory", "2MiB")
    check("fsdp shards over the devices' memory: exit 2 naming the shard and the fix", r.returncode == 2 and
          f"{cfg}: error: fsdp keeps 1/2 of the model's weights" in r.stderr and "plan.gpus" in r.stderr,
          (r.returncode, r.stderr))
    r = run("train", cfg, "--steps", "1", "--set", "plan.gpus=2", "--set", "plan.mode=zero2", "--gpu-memory", "2MiB")
    check("zero2 over the devices' memory: exit 2 naming its whole weights and partitions", r.returncode == 2 and
          f"{cfg}: error: zero2 keeps the whole model's weights and 1/2 of its gradients and AdamW state" in r.stderr
          and "4 + 12 / 2 bytes per parameter" in r.stderr, (r.returncode, r.stderr))
    # --- a one-GPU kind (host-stream) on several GPUs: exit 2 at plan.gpus naming the rule and the fix; on one GPU
    # it trains. A kind harmony-sim prices and harmony-run does not train (the registry's trains = false; none today):
    # exit 2 at plan.mode's file:line:column, the fix, and no output written
    trained = clitest.trained_kinds(SIM)
    line = text[:mode.start()].count("\n") + 1
    one_gpu = clitest.one_gpu_kinds(SIM)
    check("host-stream is a one-GPU kind harmony-run trains", "host-stream" in one_gpu and "host-stream" in trained,
          (one_gpu, trained))
    for kind in [k for k in clitest.PLAN_KINDS if k in one_gpu or k not in trained]:
        cfg = os.path.join(tmp, f"{kind}.yaml")
        body = text.replace(mode.group(0), f"mode: {kind}", 1).replace("file: ../machines/cpu-4x.yaml", "preset: cpu-4x")
        if kind in one_gpu:  # on several GPUs the one-GPU rule answers first, at plan.gpus
            r = run("train", clitest.write(cfg, body), "--steps", "1")
            check(f"{kind} on several GPUs: exit 2 at plan.gpus naming the rule and the fix", r.returncode == 2 and
                  f"{kind} runs on one GPU: plan.gpus is" in r.stderr and "use plan.gpus: 1" in r.stderr,
                  (r.returncode, r.stderr))
            at = body.index(f"mode: {kind}")  # plan.gpus, after plan.mode (the machine's stays)
            body = body[:at] + re.sub(r"gpus: *[0-9]+", "gpus: 1", body[at:], count=1)
        clitest.write(cfg, body)
        saved = os.path.join(tmp, f"{kind}-weights.safetensors")
        r = run("train", cfg, "--steps", "1", "--save-weights", saved)
        if kind in trained:
            check(f"{kind} on one GPU: trains and saves its weights", r.returncode == 0 and os.path.exists(saved),
                  (r.returncode, r.stderr))
            continue
        check(f"{kind}: refused at plan.mode (exit 2, file:line, the fix), nothing written",
              r.returncode == 2 and f"{cfg}:{line}:" in r.stderr and
              f"plan.mode {kind}: harmony-run does not train this kind yet" in r.stderr and
              "harmony-sim" in r.stderr and not os.path.exists(saved), (r.returncode, r.stderr))


def test_output(tmp):
    # --- --format json: progress on stderr, one JSON document on stdout
    r = run("train", DEFAULT, "--steps", "2", "--format", "json")
    lines = [x for x in r.stderr.splitlines() if x.startswith("step ")]
    check("--format json: progress on stderr", r.returncode == 0 and len(lines) == 2, r.stderr)
    try:
        doc = json.loads(r.stdout)
        check("--format json: stdout is the document", doc["summary"]["steps_run"] == 2, doc["summary"])
    except ValueError as e:
        check("--format json: stdout is JSON", False, (e, r.stdout[:300]))
    r = run("train", DEFAULT, "--steps", "2", "--format", "json", "--quiet")
    check("--format json --quiet: no progress", r.returncode == 0 and "step " not in r.stderr, r.stderr)
    # --- --quiet drops the progress, not the results
    r = run("train", DEFAULT, "--steps", "2", "--quiet")
    check("--quiet keeps the summary", r.returncode == 0 and "done     2 steps" in r.stdout and
          "peak per device" in r.stdout and "step " not in r.stderr, (r.stdout, r.stderr))
    # --- --version and the CUDA module: harmony-run links no CUDA library; device: cuda loads it on demand
    r = run("--version")
    check("--version exit 0", r.returncode == 0 and "harmony-run" in r.stdout, r.stderr)
    ldd = subprocess.run(["ldd", RUN], capture_output=True, text=True)
    linked = [x.split()[0] for x in ldd.stdout.splitlines() if x.strip()]
    check("harmony-run links no CUDA library", ldd.returncode == 0 and
          not any(n.startswith(("libcudart", "libcublas", "libnccl", "libcuda.")) for n in linked), linked)
    module = os.path.join(os.path.dirname(RUN), "libharmony-cuda.so")
    if os.path.exists(module):  # built with CUDA
        r = run("train", DEFAULT, "--steps", "1", "--set", "device=cuda")
        check("device: cuda loads the module and reports on the GPU", r.returncode in (0, 2) and
              (r.returncode == 0 or "no usable GPU" in r.stderr or "cuda" in r.stderr), (r.returncode, r.stderr))
        check("device: cuda: the module itself loads", "cannot be loaded" not in r.stderr, r.stderr)
        env = dict(os.environ, HARMONY_CUDA_MODULE=os.path.join(tmp, "missing.so"))
        r = run("train", DEFAULT, "--steps", "1", "--set", "device=cuda", env=env)
        check("device: cuda without its module: exit 2 naming it", r.returncode == 2 and "missing.so" in r.stderr and
              "cannot be loaded" in r.stderr and "device: cpu" in r.stderr, (r.returncode, r.stderr))
    else:
        r = run("train", DEFAULT, "--steps", "1", "--set", "device=cuda")
        check("device: cuda not built in: exit 2", r.returncode == 2 and "not built into" in r.stderr, r.stderr)


with tempfile.TemporaryDirectory() as tmp:
    test_messages(tmp)
    test_out_of_memory(tmp)
    test_output(tmp)
    if SANITIZED:
        print("SKIP the RLIMIT_AS / RLIMIT_DATA cases: a sanitizer build cannot start under those limits")
    else:
        test_host_memory(tmp)
    test_nonfinite(tmp)
    test_checkpoint_lock(tmp)
    test_nohup(tmp)

finish()
