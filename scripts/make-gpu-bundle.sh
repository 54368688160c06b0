#!/usr/bin/env bash
# Makes the self-contained folder gpu-check.sh runs from on a GPU machine that has the NVIDIA driver, CUDA and
# python3 with PyTorch, but none of harmony's libraries and no network (issue 34): every binary gpu-check.sh runs
# and every shared module the build made beside them (keeping the build tree's layout under bin/, so paths between
# them hold), every shared library ldd names that is not CUDA's, the driver's, glibc's or the compiler runtime's
# (copied into lib/, found through RUNPATH $ORIGIN/.../lib), the compiler runtime (libstdc++, libgcc_s) into
# lib/runtime/ as a fallback, and the scripts, configs and test data the check reads. Then it checks with ldd that
# every library resolves inside the bundle or is one of those left to the GPU machine (listed in gpu-bundle.json
# with the GLIBC_ / GLIBCXX_ symbol versions each file needs), and that the bundle is at most BUNDLE_MAX_MIB (60) MiB.
# Why the runtime is a fallback, not on RUNPATH: Debian 12's libstdc++ needs GLIBC_2.36 where our binaries need
# 2.34, so on a glibc 2.34/2.35 image (Ubuntu 22.04) the bundled one would not load while the system's (GCC 12's,
# GLIBCXX_3.4.30, what they need) would; gpu-check.sh puts lib/runtime on LD_LIBRARY_PATH only when the system's
# libstdc++ is too old for the binaries (ldd: "version `GLIBCXX_...' not found").
#
# usage: scripts/make-gpu-bundle.sh BUILD_DIR OUT_DIR [--tar]
#   BUILD_DIR  a release build with the CUDA device, e.g.
#              meson setup build-gpu -Dbuildtype=release -Dcuda=enabled -Dgpu_arch=90 -Dfuzz=disabled
#              ninja -C build-gpu apps/harmony-run sim/harmony-sim bench/bench_cuda bench/bench_adamw \
#                tests/test_backend_device_conformance tests/test_backend_cuda_device \
#                tests/test_backend_adamw_parallel tests/test_backend_cuda_index
#   OUT_DIR    created (or replaced, if it holds an earlier bundle); --tar also writes OUT_DIR.tar.gz
#   on the GPU machine: OUT_DIR/scripts/gpu-check.sh RESULTS_DIR    (docs/benchmarks.md, "GPU check")
# Needs patchelf, ldd and objdump (scripts/install-deps.sh). Exit 0: made and checked; 1: a check failed (the
# folder is left for inspection); 2: bad input.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
max_mib=${BUNDLE_MAX_MIB:-60}

usage() { sed -n '14,24p' "$0" >&2; exit 2; }
die() { echo "make-gpu-bundle: error: $*" >&2; exit 2; }
fail() { echo "make-gpu-bundle: FAILED: $*" >&2; exit 1; }
(($# == 2 || $# == 3)) || usage
tar=false
[[ $# == 3 ]] && { [[ $3 == --tar ]] || usage; tar=true; }
[[ -f $1/build.ninja ]] || die "$1 is not a Meson build folder (no build.ninja)"
build=$(cd "$1" && pwd)
for tool in patchelf ldd objdump; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found (apt-get install patchelf binutils; scripts/install-deps.sh)"
done

# What gpu-check.sh runs (scripts/gpu-check.sh, step 1 checks the same list).
binaries=(apps/harmony-run sim/harmony-sim bench/bench_cuda bench/bench_adamw tests/test_backend_device_conformance
  tests/test_backend_cuda_device tests/test_backend_adamw_parallel tests/test_backend_cuda_index)
missing=()
for b in "${binaries[@]}"; do [[ -x $build/$b ]] || missing+=("$b"); done
if ((${#missing[@]})); then
  [[ " ${missing[*]} " == *" tests/test_backend_cuda_device "* ]] &&
    die "$build has no tests/test_backend_cuda_device: not a CUDA build (meson setup -Dcuda=enabled)"
  die "$build lacks ${missing[*]} (ninja -C $build ${missing[*]})"
fi
# Shared modules the build made (a dlopen()ed device, say): every .so outside Meson's private and object folders.
modules=()
while IFS= read -r -d '' m; do modules+=("${m#"$build"/}"); done < <(find "$build" -name '*.so' -type f \
  -not -path '*/meson-private/*' -not -path '*.p/*' -print0 | sort -z)

mkdir -p "$(dirname "$2")"
out=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
if [[ -e $out ]]; then
  [[ -f $out/.harmony-gpu-bundle || -z $(ls -A "$out" 2>/dev/null) ]] ||
    die "$out exists and is not an earlier bundle (no .harmony-gpu-bundle in it): give a new folder"
  rm -rf "$out"
fi
mkdir -p "$out/bin" "$out/lib/runtime"
touch "$out/.harmony-gpu-bundle"  # so that a rerun may replace this folder, complete or not

# --- the binaries and modules, in the build tree's layout ------------------------------------------------------------
elfs=()
for f in "${binaries[@]}" ${modules[@]+"${modules[@]}"}; do
  mkdir -p "$out/bin/$(dirname "$f")"
  cp -p "$build/$f" "$out/bin/$f"
  elfs+=("bin/$f")
done

# --- the libraries: everything but CUDA's, the driver's and glibc's; the compiler runtime as a fallback -------------
# Left to the GPU machine: the driver (libcuda, libnvidia-*), the CUDA toolkit's runtime libraries (cudart, cuBLAS,
# cuBLASLt, NCCL, NVRTC, nvJitLink, NVTX, cuFFT, cuRAND, cuSPARSE, cuSOLVER, cuDNN) and glibc (libc, libm,
# libpthread, librt, libdl, libutil, libresolv, libmvec, the loader, the vDSO).
runtime_re='^(libstdc\+\+|libgcc_s)\.so'
cuda_re='(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[A-Za-z0-9_-]+|libnvrtc[A-Za-z0-9_-]*|libnvJitLink'
cuda_re+='|libnvToolsExt|libcufft|libcurand|libcusparse|libcusolver|libcudnn[A-Za-z0-9_]*)'
left_re="^$cuda_re\\.so|^(libc|libm|libpthread|librt|libdl|libutil|libresolv|libmvec)\\.so\\.[0-9]+\$|^ld-linux|^linux-vdso|^linux-gate"
# ldd_pairs FILE: "soname<TAB>path" per library ldd names ("not found" as the path when it does not resolve)
ldd_pairs() {
  ldd "$1" 2>&1 | awk '
    /=> not found/ { print $1 "\tnot found"; next }
    /=>/ { p = $3; if (p ~ /^\(/) p = ""; print $1 "\t" p; next }
    /^\t\/.*ld-linux/ { n = $1; sub(/.*\//, "", n); print n "\t" $1 }'
}
declare -A bundled=()
for f in "${elfs[@]}"; do
  while IFS=$'\t' read -r name path; do
    [[ $name =~ $left_re ]] && continue
    [[ $path == "not found" ]] && die "$f: $name not found on this builder (ldd): cannot bundle it"
    [[ -z $path ]] && continue
    if [[ -z ${bundled[$name]:-} ]]; then
      dest=$out/lib/$name
      [[ $name =~ $runtime_re ]] && dest=$out/lib/runtime/$name
      cp -L "$path" "$dest"
      chmod u+w "$dest"
      bundled[$name]=$path
    fi
  done < <(ldd_pairs "$out/$f")
done

# --- RUNPATH: $ORIGIN-relative to lib/ first, then what the build set that does not point into it --------------------
for f in "${elfs[@]}"; do
  rel=$(realpath --relative-to="$(dirname "$out/$f")" "$out/lib")
  paths=("\$ORIGIN/$rel")
  old=$(patchelf --print-rpath "$out/$f")
  IFS=: read -r -a olds <<<"$old"
  for p in ${olds[@]+"${olds[@]}"}; do
    [[ -z $p || $p == "$build"* || $p == "$root"* ]] && continue  # the build tree is not there on the GPU machine
    paths+=("$p")  # $ORIGIN/... between the build's own files; a CUDA folder such as /usr/local/cuda/lib64
  done
  patchelf --set-rpath "$(IFS=:; echo "${paths[*]}")" "$out/$f"
done
# shellcheck disable=SC2016  # $ORIGIN is for the loader, not the shell
for l in "$out"/lib/*.so* "$out"/lib/runtime/*.so*; do [[ -f $l ]] && patchelf --set-rpath '$ORIGIN' "$l"; done

# --- what gpu-check.sh reads ------------------------------------------------------------------------------------------
data=(scripts/gpu-check.sh scripts/gpu_verdict.py scripts/torch_side_by_side.py configs/run/default.yaml
  configs/run/llama.yaml configs/machines/cpu-4x.yaml tests/data/gpt2_tiny)
for d in "${data[@]}"; do
  mkdir -p "$out/$(dirname "$d")"
  cp -rp "$root/$d" "$out/$d"
done
cat >"$out/README.md" <<'EOF'
# harmony GPU bundle (scripts/make-gpu-bundle.sh)

On the GPU machine (NVIDIA driver, CUDA runtime libraries, python3 with PyTorch; no build tools needed):

    ./scripts/gpu-check.sh /tmp/gpu-check      # the whole check, <= 8 minutes; the verdict table at the end
    python3 scripts/gpu_verdict.py /tmp/gpu-check  # the verdict again

bin/ holds the binaries (the build tree's layout), lib/ every library they need that is not CUDA's, the driver's
or glibc's; gpu-bundle.json lists what is left to the machine and the symbol versions each binary needs.
What each row means: docs/benchmarks.md, "GPU check".
EOF

# (the size once before the checks, which take seconds, and once with the manifest at the end)
size=$(du -sb "$out" | cut -f1)
((size <= max_mib * 1048576)) || fail "$out is $((size / 1048576)) MiB, over BUNDLE_MAX_MIB = $max_mib MiB"

# --- check: every library resolves inside the bundle or is left to the GPU machine; record it ------------------------
problems=()
report=$(mktemp)
trap 'rm -f "$report"' EXIT
libfiles=()
for l in "$out"/lib/*.so* "$out"/lib/runtime/*.so*; do [[ -f $l ]] && libfiles+=("${l#"$out"/}"); done
for f in "${elfs[@]}" ${libfiles[@]+"${libfiles[@]}"}; do
  while IFS=$'\t' read -r name path; do
    [[ -n $path && $path != "not found" ]] && path=$(realpath -s "$path")  # bin/apps/../../lib/x -> lib/x
    if [[ $path == "not found" ]]; then
      problems+=("$f: $name not found")
    elif [[ $name =~ $left_re ]]; then
      printf '%s\t%s\tleft\t%s\n' "$f" "$name" "$path" >>"$report"
    elif [[ $name =~ $runtime_re && -f $out/lib/runtime/$name ]]; then
      printf '%s\t%s\truntime\t%s\n' "$f" "$name" "$path" >>"$report"  # the system's here; lib/runtime/ if too old
    elif [[ $path == "$out/lib/"* ]]; then
      printf '%s\t%s\tbundled\t%s\n' "$f" "$name" "${path#"$out"/}" >>"$report"
    else
      problems+=("$f: $name resolves to $path, outside the bundle")
    fi
  done < <(ldd_pairs "$out/$f")
done
# ... and with the fallback runtime in place of the system's, as gpu-check.sh would load it
for f in "${elfs[@]}"; do
  bad=$(LD_LIBRARY_PATH="$out/lib/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$out/$f" 2>&1 |
    grep "not found" | tr -s ' \t\n' ' ' || true)
  [[ -n $bad ]] && problems+=("$f with lib/runtime: $bad")
done
((${#problems[@]} == 0)) || fail "$(printf '%s; ' "${problems[@]}")"

python3 - "$out" "$build" "$root" "$report" "$max_mib" "${elfs[@]}" <<'PY'
import hashlib, json, os, re, subprocess, sys, time
out, build, root, report, max_mib, *elfs = sys.argv[1:]

def versions(path, prefix):
    """The highest PREFIX_x.y[.z] symbol version the file needs (objdump -T: its undefined dynamic symbols)."""
    text = subprocess.run(["objdump", "-T", path], capture_output=True, text=True).stdout
    need = {tuple(int(x) for x in m.split(".")) for m in re.findall(rf"\*UND\*.*?\b{prefix}_([0-9.]+)", text)}
    return f"{prefix}_" + ".".join(map(str, max(need))) if need else None

def provides(path, prefix):
    text = subprocess.run(["objdump", "-p", path], capture_output=True, text=True).stdout
    have = {tuple(int(x) for x in m.split(".")) for m in re.findall(rf"\b{prefix}_([0-9.]+)", text)}
    return f"{prefix}_" + ".".join(map(str, max(have))) if have else None

libs = {}
for line in open(report):
    f, name, kind, path = line.rstrip("\n").split("\t")
    libs.setdefault(f, []).append({"soname": name, "from": kind, "path": path})
deps = json.load(open(os.path.join(build, "meson-info", "intro-dependencies.json")))
opts = {o["name"]: o["value"] for o in json.load(open(os.path.join(build, "meson-info", "intro-buildoptions.json")))}
cuda = next((d.get("version") for d in deps if d["name"] == "cuda"), None)
git = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True).stdout.strip()
commit = git("rev-parse", "HEAD") or None
files, total = {}, 0
for dp, _, fs in os.walk(out):
    for n in sorted(fs):
        if n == ".harmony-gpu-bundle":
            continue
        p = os.path.join(dp, n)
        b = open(p, "rb").read()
        files[os.path.relpath(p, out)] = {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
        total += len(b)
libdir = os.path.join(out, "lib")
all_elfs = elfs + sorted(os.path.relpath(os.path.join(d, n), out) for d in (libdir, os.path.join(libdir, "runtime"))
                         for n in os.listdir(d) if ".so" in n)
binaries = {f: {"needs_glibc": versions(os.path.join(out, f), "GLIBC"),
                "needs_glibcxx": versions(os.path.join(out, f), "GLIBCXX"),
                "needs_cxxabi": versions(os.path.join(out, f), "CXXABI"),
                "libraries": libs.get(f, [])} for f in all_elfs}
left = sorted({l["soname"] for ls in libs.values() for l in ls if l["from"] in ("left", "runtime")})
glibc_need = [b["needs_glibc"] for f, b in binaries.items() if b["needs_glibc"] and not f.startswith("lib/runtime/")]
runtime_need = [b["needs_glibc"] for f, b in binaries.items() if b["needs_glibc"] and f.startswith("lib/runtime/")]
cxx_need = [b["needs_glibcxx"] for f, b in binaries.items() if b["needs_glibcxx"]]
key = lambda v: tuple(int(x) for x in v.split("_")[1].split("."))
stdcxx = os.path.join(out, "lib", "runtime", "libstdc++.so.6")
manifest = {
    "format": "harmony-gpu-bundle", "format_version": 1,
    "commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "cuda_version": cuda, "gpu_arch": opts.get("gpu_arch"), "buildtype": opts.get("buildtype"),
    "builder": {"glibc": os.confstr("CS_GNU_LIBC_VERSION"), "machine": os.uname().machine},
    "needs_glibc": max(glibc_need, key=key) if glibc_need else None,
    "needs_glibcxx": max(cxx_need, key=key) if cxx_need else None,
    "runtime_fallback": {"dir": "lib/runtime", "provides_glibcxx": provides(stdcxx, "GLIBCXX")
                         if os.path.exists(stdcxx) else None,
                         "needs_glibc": max(runtime_need, key=key) if runtime_need else None},
    "left_to_gpu_machine": left,
    "binaries": binaries,
    "size_bytes": total, "max_bytes": int(max_mib) * 2**20,
    "files": files,
}
with open(os.path.join(out, "gpu-bundle.json"), "w") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
rt = manifest["runtime_fallback"]
print(f"make-gpu-bundle: {out}: {len(elfs)} binaries, {len(all_elfs) - len(elfs)} libraries bundled, "
      f"{total / 2**20:.1f} MiB; left to the GPU machine: {', '.join(left)}; needs {manifest['needs_glibc']} and "
      f"{manifest['needs_glibcxx']} (lib/runtime provides {rt['provides_glibcxx']}, needs {rt['needs_glibc']}; "
      f"builder {manifest['builder']['glibc']}); CUDA {cuda}, sm {opts.get('gpu_arch')}")
PY

size=$(du -sb "$out" | cut -f1)
((size <= max_mib * 1048576)) || fail "$out is $((size / 1048576)) MiB, over BUNDLE_MAX_MIB = $max_mib MiB"
if [[ $tar == true ]]; then
  tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
  tsize=$(stat -c %s "$out.tar.gz")
  ((tsize <= max_mib * 1048576)) || fail "$out.tar.gz is $((tsize / 1048576)) MiB, over $max_mib MiB"
  echo "make-gpu-bundle: $out.tar.gz ($((tsize / 1024)) KiB)"
fi
