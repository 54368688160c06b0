#!/usr/bin/env python3
"""scripts/make-gpu-bundle.sh on this build (issue 34): the folder gpu-check.sh runs from on a GPU machine that has
CUDA, the driver and python3 but none of harmony's libraries. Checks: every binary gpu-check.sh runs is there (and
any shared module the build made); every library ldd names resolves inside the bundle or is CUDA's, the driver's,
glibc's or the compiler runtime's (whose fallback copy is in lib/runtime/), restated here independently of the
script; RUNPATH leads to lib/; the manifest's hashes, sizes and symbol versions; at most 60 MiB (and the tarball);
the bundled harmony-run trains from inside the bundle (with and without lib/runtime); gpu-check.sh run from the
bundle finds it (env.json names it) and, with an nvidia-smi stand-in that cannot reach a driver, stops at the
environment; an over-size bundle is exit 1; bad input exit 2. Exit 77 (SKIP) when the build has no CUDA device or
patchelf / objdump are missing."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from clitest import ROOT, check, summary

BUILD = os.path.abspath(sys.argv[1])
MAKE = os.path.join(ROOT, "scripts/make-gpu-bundle.sh")
BINARIES = ["apps/harmony-run", "sim/harmony-sim", "bench/bench_cuda", "bench/bench_adamw",
            "tests/test_backend_device_conformance", "tests/test_backend_cuda_device", "tests/test_backend_adamw_parallel",
            "tests/test_backend_cuda_index"]
# What may be left to the GPU machine: the driver, CUDA's runtime libraries, glibc (and the compiler runtime, which
# the bundle also carries in lib/runtime/ for images whose own is too old).
LEFT = re.compile(r"^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-\S+|libnvrtc\S*|libnvJitLink|"
                  r"libnvToolsExt|libcufft|libcurand|libcusparse|libcusolver|libcudnn\S*)\.so|"
                  r"^(libc|libm|libpthread|librt|libdl|libutil|libresolv|libmvec)\.so\.\d+$|^ld-linux|^linux-vdso")
RUNTIME = re.compile(r"^(libstdc\+\+|libgcc_s)\.so")


def make(*args, env=None):
    return subprocess.run(["bash", MAKE, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def ldd(path, env=None):
    """[(soname, resolved path or 'not found')] for every library ldd names."""
    r = subprocess.run(["ldd", path], capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    out = []
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (not found|\S+)", line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def main():
    if not os.access(os.path.join(BUILD, "tests/test_backend_cuda_device"), os.X_OK):
        print("SKIP: this build has no CUDA device (meson setup -Dcuda=enabled)")
        return 77
    if not (shutil.which("patchelf") and shutil.which("objdump")):
        print("SKIP: patchelf or objdump missing (scripts/install-deps.sh)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        bundle = os.path.join(tmp, "bundle")
        r = make(BUILD, bundle, "--tar")
        check("make: exit 0", r.returncode == 0, r.stdout + r.stderr)
        if r.returncode != 0:
            return summary()
        print(r.stdout.strip())
        m = json.load(open(os.path.join(bundle, "gpu-bundle.json")))
        check("manifest: its format, CUDA version, commit", m["format"] == "harmony-gpu-bundle"
              and m["cuda_version"] and m["commit"], {k: m.get(k) for k in ("format", "cuda_version", "commit")})
        modules = [os.path.relpath(os.path.join(d, f), BUILD) for d, _, fs in os.walk(BUILD) for f in fs
                   if f.endswith(".so") and "meson-private" not in d and ".p" not in os.path.basename(d)]
        for b in BINARIES + modules:
            p = os.path.join(bundle, "bin", b)
            check(f"{b} in the bundle, executable", os.access(p, os.X_OK) or b.endswith(".so"), p)
            check(f"{b} in the manifest", f"bin/{b}" in m["binaries"], sorted(m["binaries"]))

        # every library: inside the bundle, or left to the GPU machine by the rule above
        lib = os.path.join(bundle, "lib")
        elfs = [os.path.join(bundle, "bin", b) for b in BINARIES + modules] + \
            [os.path.join(d, f) for d, _, fs in os.walk(lib) for f in fs]
        outside = []
        for e in elfs:
            for name, path in ldd(e):
                if path == "not found":
                    outside.append(f"{e}: {name} not found")
                elif os.path.realpath(path).startswith(os.path.realpath(lib) + os.sep):
                    continue
                elif not (LEFT.match(name) or RUNTIME.match(name)):
                    outside.append(f"{os.path.relpath(e, bundle)}: {name} => {path}")
        check("every library resolves in the bundle or is CUDA's, the driver's, glibc's or the runtime's",
              not outside, outside)
        bundled = sorted(os.listdir(lib))
        check("the libraries the GPU image lacks are bundled (fmt, yaml-cpp at least)",
              any(x.startswith("libfmt.so") for x in bundled) and any(x.startswith("libyaml-cpp.so") for x in bundled),
              bundled)
        check("the compiler runtime as a fallback in lib/runtime/",
              sorted(os.listdir(os.path.join(lib, "runtime"))) == ["libgcc_s.so.1", "libstdc++.so.6"],
              os.listdir(os.path.join(lib, "runtime")))
        check("manifest: what is left is only CUDA/driver/glibc/runtime",
              m["left_to_gpu_machine"] and all(LEFT.match(x) or RUNTIME.match(x) for x in m["left_to_gpu_machine"]),
              m["left_to_gpu_machine"])
        check("manifest: symbol versions recorded", re.match(r"GLIBC_2\.\d+$", m["needs_glibc"] or "")
              and re.match(r"GLIBCXX_3\.4\.\d+$", m["needs_glibcxx"] or "")
              and m["runtime_fallback"]["provides_glibcxx"], (m["needs_glibc"], m["needs_glibcxx"],
                                                              m["runtime_fallback"]))
        with_rt = {"LD_LIBRARY_PATH": os.path.join(lib, "runtime")}
        bad = [f"{b}: {n}" for b in BINARIES for n, p in ldd(os.path.join(bundle, "bin", b), with_rt)
               if p == "not found"]
        check("every binary also loads with lib/runtime first", not bad, bad)
        rp = subprocess.run(["patchelf", "--print-rpath", os.path.join(bundle, "bin/apps/harmony-run")],
                            capture_output=True, text=True).stdout.strip()
        check("RUNPATH: $ORIGIN/../../lib first, nothing of the build tree", rp.split(":")[0] == "$ORIGIN/../../lib"
              and BUILD not in rp, rp)
        bad = [f for f, v in m["files"].items()
               if hashlib.sha256(open(os.path.join(bundle, f), "rb").read()).hexdigest() != v["sha256"]]
        check("manifest hashes match the files", not bad and len(m["files"]) > 10, bad)
        for need in ["scripts/gpu-check.sh", "scripts/gpu_verdict.py", "scripts/torch_side_by_side.py",
                     "configs/run/default.yaml", "configs/run/llama.yaml", "configs/machines/cpu-4x.yaml",
                     "tests/data/gpt2_tiny/model.safetensors"]:
            check(f"{need} in the bundle", os.path.exists(os.path.join(bundle, need)))
        size = sum(v["bytes"] for v in m["files"].values())
        check("at most 60 MiB", size <= 60 * 2**20 and m["size_bytes"] == size, size)
        check("the tarball at most 60 MiB", os.path.getsize(bundle + ".tar.gz") <= 60 * 2**20)
        print(f"bundle: {size / 2**20:.1f} MiB, tarball {os.path.getsize(bundle + '.tar.gz') / 2**20:.1f} MiB; left "
              f"to the GPU machine: {', '.join(m['left_to_gpu_machine'])}")

        # the bundled harmony-run trains from inside the bundle, with the system's runtime and with the bundle's
        for label, env in (("system runtime", {}), ("lib/runtime", with_rt)):
            r = subprocess.run([os.path.join(bundle, "bin/apps/harmony-run"), "train", "configs/run/default.yaml",
                                "--steps", "1", "--format", "json", "--quiet"], capture_output=True, text=True,
                               cwd=bundle, timeout=120, env=dict(os.environ, **env))
            check(f"bundled harmony-run trains ({label})", r.returncode == 0 and json.loads(r.stdout)["steps"],
                  r.stderr)

        # gpu-check.sh from the bundle: finds it; stops at the environment without a driver
        fake = os.path.join(tmp, "fakebin")
        os.makedirs(fake)
        with open(os.path.join(fake, "nvidia-smi"), "w") as f:
            f.write("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n"
                    "exit 9\n")
        os.chmod(os.path.join(fake, "nvidia-smi"), 0o755)
        out = os.path.join(tmp, "gc")
        r = subprocess.run(["bash", os.path.join(bundle, "scripts/gpu-check.sh"), out], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, PATH=fake + os.pathsep + os.environ["PATH"]))
        envj = json.load(open(os.path.join(out, "env.json"))) if os.path.exists(os.path.join(out, "env.json")) else {}
        check("gpu-check.sh from the bundle: exit 1, environment FAILED", r.returncode == 1
              and "| environment | FAILED |" in r.stdout, r.stdout + r.stderr)
        check("gpu-check.sh from the bundle: env.json names the bundle and its CUDA version",
              envj.get("bundle") == bundle and envj.get("toolkit_cuda") == m["cuda_version"], envj)

        # an over-size bundle fails; bad input is exit 2; an earlier bundle is replaced
        small = os.path.join(tmp, "small")  # an earlier (partial) bundle there: replaced
        os.makedirs(small)
        open(os.path.join(small, ".harmony-gpu-bundle"), "w").close()
        open(os.path.join(small, "stale"), "w").close()
        r = make(BUILD, small, env={"BUNDLE_MAX_MIB": "1"})
        check("BUNDLE_MAX_MIB=1: exit 1 naming the limit", r.returncode == 1 and "over BUNDLE_MAX_MIB = 1 MiB" in r.stderr,
              r.stderr)
        check("an earlier bundle is replaced", not os.path.exists(os.path.join(small, "stale")), os.listdir(small))
        r = make(os.path.join(ROOT, "docs"), os.path.join(tmp, "x"))
        check("not a build folder: exit 2", r.returncode == 2 and "not a Meson build folder" in r.stderr, r.stderr)
        r = make(BUILD, os.path.join(ROOT, "scripts"))
        check("an existing folder that is not a bundle: exit 2, untouched", r.returncode == 2
              and "not an earlier bundle" in r.stderr and os.path.exists(MAKE), r.stderr)
        r = make(BUILD)
        check("usage: exit 2", r.returncode == 2 and "usage" in r.stderr, r.stderr)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
