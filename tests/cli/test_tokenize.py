#!/usr/bin/env python3
"""scripts/tokenizer/tokenize.mjs end to end: GPT-2's own BPE gives the known ids ("Hello world" -> 15496, 995),
the file is llm.c's (1024-byte header: magic 20240520, version 1, count; uint16 ids; <|endoftext|> = 50256 before
each document), "<|endoftext|>" inside a text is ordinary text, bad input is exit 2, the output follows the C++
tools' rules (core/base/atomic_file.hpp: devices, FIFOs and folders refused before any work, a symlink written
through, a regular file replaced atomically with its permission bits, a failed write under `ulimit -f` exit 2 with
the previous file kept and no temp), and harmony-run trains on the tokens of README.md exactly as the README's
example does. SKIP (77) without node or js-tiktoken installed."""
import json
import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile

from clitest import ROOT, check, finish

RUN = sys.argv[1]
# Under ASan + UBSan (tests/meson.build sets HARMONY_SANITIZED) one step of the 50257-token model, not two: the
# checks (exit 0, the first loss, the trace) need one step; the second cost ~20 s there.
STEPS = "1" if os.environ.get("HARMONY_SANITIZED") == "1" else "2"
TOKENIZE = os.path.join(ROOT, "scripts/tokenizer/tokenize.mjs")

if shutil.which("node") is None or not os.path.isdir(os.path.join(ROOT, "scripts/tokenizer/node_modules/js-tiktoken")):
    print("SKIP: needs node and js-tiktoken (bash scripts/install-deps.sh runs npm ci in scripts/tokenizer)")
    sys.exit(77)


def tokenize(*args, preexec_fn=None, timeout=120):
    try:
        return subprocess.run(["node", TOKENIZE, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                              preexec_fn=preexec_fn)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, None, "", f"(no answer in {timeout} s)")


def temps(*dirs):
    return [os.path.join(d, f) for d in dirs for f in os.listdir(d) if ".tmp" in f]


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    ids = list(struct.unpack(f"<{(len(data) - 1024) // 2}H", data[1024:]))
    return header, ids, len(data)


with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "hello.txt")
    with open(text, "w") as f:
        f.write("Hello world")
    out = os.path.join(tmp, "hello.bin")
    r = tokenize(text, out, "--no-eot", "--print")
    check("Hello world: exit 0", r.returncode == 0, r.stderr)
    check("Hello world -> [15496, 995] printed", r.stdout.strip() == "[15496,995]", r.stdout)
    header, ids, size = read_tokens(out)
    check("llm.c header: magic, version 1, count 2", header[:3] == (20240520, 1, 2) and not any(header[3:]), header[:4])
    check("the file holds 15496, 995 after the header", ids == [15496, 995] and size == 1024 + 4, (ids, size))

    # Documents start with <|endoftext|> as llm.c's data scripts write them; a second file is a second document.
    text2 = os.path.join(tmp, "two.txt")
    with open(text2, "w") as f:
        f.write(" the<|endoftext|>")
    r = tokenize(text, text2, out)
    header, ids, _ = read_tokens(out)
    check("two documents, each after 50256; <|endoftext|> in a text is ordinary text",
          r.returncode == 0 and ids[:4] == [50256, 15496, 995, 50256] and ids[4] == 262 and 50256 not in ids[5:]
          and header[2] == len(ids), (r.stderr, ids))

    r = tokenize(os.path.join(tmp, "missing.txt"), out)
    check("a missing text: exit 2 naming it", r.returncode == 2 and "missing.txt" in r.stderr, r.stderr)
    r = tokenize(text)
    check("no output path: exit 2 with usage", r.returncode == 2 and "usage" in r.stderr, r.stderr)

    # The output path: the rules of the C++ tools' atomic writer, checked before the text is read.
    outs = os.path.join(tmp, "outs")
    os.mkdir(outs)
    fifo = os.path.join(outs, "fifo")
    os.mkfifo(fifo)
    folder = os.path.join(outs, "folder")
    os.mkdir(folder)
    # a character device of our own (the null device's numbers), so that a regression never replaces /dev/null
    chardev = os.path.join(outs, "chardev")
    try:
        os.mknod(chardev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        chardev = None
    fifo_link = os.path.join(outs, "fifo_link")
    os.symlink("fifo", fifo_link)
    bad = [(fifo, "not a regular file (a FIFO)"), (folder, "Is a directory"),
           (fifo_link, "not a regular file (a FIFO)"),
           (os.path.join(outs, "missing", "t.bin"), "No such file or directory")]
    if chardev:
        bad.append((chardev, "not a regular file (a character device)"))
    for path, reason in bad:
        r = tokenize(text, path)
        check(f"output {os.path.relpath(path, outs)}: exit 2 with '{reason}'",
              r.returncode == 2 and path in r.stderr and reason in r.stderr, (r.returncode, r.stderr))
    # checked before the work: a missing text is never reached
    r = tokenize(os.path.join(tmp, "missing.txt"), fifo)
    check("the output is refused before the text is read", r.returncode == 2 and "a FIFO" in r.stderr and
          "missing.txt" not in r.stderr, (r.returncode, r.stderr))
    check("the FIFO is still a FIFO, the link still a link to it",
          stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(fifo_link) and os.readlink(fifo_link) == "fifo")
    if chardev:
        check("the device is still a device", stat.S_ISCHR(os.lstat(chardev).st_mode))
    check("the folder is still an empty folder", os.path.isdir(folder) and not os.listdir(folder))

    real = os.path.join(outs, "real")
    os.mkdir(real)
    target = os.path.join(real, "t.bin")
    with open(target, "w") as f:
        f.write("old")
    os.chmod(target, 0o640)
    link = os.path.join(outs, "link.bin")
    os.symlink("real/t.bin", link)  # relative to the link's folder
    r = tokenize(text, link, "--no-eot")
    check("through a symlink: exit 0, the link kept, its target replaced with the permission bits",
          r.returncode == 0 and os.path.islink(link) and os.readlink(link) == "real/t.bin" and
          read_tokens(target)[1] == [15496, 995] and stat.S_IMODE(os.stat(target).st_mode) == 0o640, r.stderr)
    dangling = os.path.join(outs, "dangling.bin")
    os.symlink(os.path.join(real, "new.bin"), dangling)
    r = tokenize(text, dangling, "--no-eot")
    check("through a dangling symlink: its target created", r.returncode == 0 and os.path.islink(dangling) and
          read_tokens(os.path.join(real, "new.bin"))[1] == [15496, 995], r.stderr)
    check("no temp file beside a link or a target", not temps(outs, real), temps(outs, real))

    r = tokenize(fifo, os.path.join(outs, "from_fifo.bin"), timeout=30)
    check("a FIFO as the text: exit 2, never blocking", r.returncode == 2 and "not a regular file (a FIFO)" in r.stderr,
          (r.returncode, r.stderr))

    # A write past the file size limit (SIGXFSZ at its default action, as a shell's `ulimit -f` leaves it): exit 2
    # naming the file and the limit, the previous file kept, no temp.
    def limit_4k():
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    big = os.path.join(real, "big.bin")
    with open(big, "w") as f:
        f.write("previous tokens")
    r = tokenize(os.path.join(ROOT, "README.md"), big, preexec_fn=limit_4k)
    check("over the file size limit: exit 2 naming the file, 'File too large' and the limit",
          r.returncode == 2 and big in r.stderr and "File too large" in r.stderr and "4096 bytes" in r.stderr,
          (r.returncode, r.stderr))
    with open(big) as f:
        kept = f.read()
    check("over the file size limit: the previous file kept, no temp", kept == "previous tokens" and not temps(real),
          (kept[:40], temps(real)))

    # README: tokenize README.md, then train the default config on it with GPT-2's vocabulary.
    tokens = os.path.join(tmp, "my_tokens.bin")
    r = tokenize(os.path.join(ROOT, "README.md"), tokens)
    check("README.md tokenizes", r.returncode == 0, r.stderr)
    r = subprocess.run([RUN, "train", "configs/run/default.yaml", "--data", tokens, "--set", "model.gpt2.vocab_size=50257",
                        "--gpu-memory", "64MiB", "--steps", STEPS, "--format", "json", "--trace",
                        os.path.join(tmp, "run.json")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    check("harmony-run trains on the GPT-2 tokens: exit 0", r.returncode == 0, r.stderr)
    if r.returncode == 0:
        s = json.loads(r.stdout)["summary"]
        # An untrained model over 50257 tokens starts near ln(50257) = 10.8.
        check("first loss near ln(50257)", abs(s["first_loss"] - 10.825) < 0.5, s["first_loss"])
        check("the trace was written", os.path.getsize(os.path.join(tmp, "run.json")) > 0)
    r = subprocess.run([RUN, "train", "configs/run/default.yaml", "--data", tokens, "--steps", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    check("GPT-2 tokens with the default vocab of 256: exit 2 naming vocab_size",
          r.returncode == 2 and "vocab" in r.stderr, r.stderr)

finish()
