#!/usr/bin/env python3
"""scripts/tokenizer/tokenize.mjs end to end: GPT-2's own BPE gives the known ids ("Hello world" -> 15496, 995),
the file is llm.c's (1024-byte header: magic 20240520, version 1, count; uint16 ids; <|endoftext|> = 50256 before
each document), "<|endoftext|>" inside a text is ordinary text, bad input is exit 2, and harmony-run trains on
the tokens of README.md exactly as the README's example does. SKIP (77) without node or js-tiktoken installed."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

RUN = sys.argv[1]
ROOT = os.environ.get("HARMONY_SOURCE_DIR", ".")
# Under ASan + UBSan (tests/meson.build sets HARMONY_SANITIZED) one step of the 50257-token model, not two: the
# checks (exit 0, the first loss, the trace) need one step; the second cost ~20 s there.
STEPS = "1" if os.environ.get("HARMONY_SANITIZED") == "1" else "2"
TOKENIZE = os.path.join(ROOT, "scripts/tokenizer/tokenize.mjs")
failures = []
passed = 0

if shutil.which("node") is None or not os.path.isdir(os.path.join(ROOT, "scripts/tokenizer/node_modules/js-tiktoken")):
    print("SKIP: needs node and js-tiktoken (bash scripts/install-deps.sh runs npm ci in scripts/tokenizer)")
    sys.exit(77)


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(f"{name}: {str(detail)[:2000]}")


def tokenize(*args):
    return subprocess.run(["node", TOKENIZE, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


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

print(f"{passed} passed, {len(failures)} failed")
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
