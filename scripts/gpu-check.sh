#!/usr/bin/env bash
# The CUDA device's check on a machine with an NVIDIA GPU (issues 15, 34): runs everything within one deadline
# (DEADLINE_S, default 480 s, build included) and records every output in OUT_DIR; the verdict, one table with
# PASSED / FAILED / SKIPPED per check, is scripts/gpu_verdict.py's (tested in CI on recorded outputs). Steps:
#   0. environment: the GPU, the driver's CUDA version against the toolkit's (or the bundle's), cudart/cuBLAS/NCCL
#      (loader cache, the toolkit, PyTorch's nvidia wheels: a folder found outside the cache goes on
#      LD_LIBRARY_PATH) -> env.json (a failure here stops the check: nothing else can be meaningful);
#   1. the binaries: built (release, -Dcuda=enabled, sm_90 plus the local GPU's) in $BUILD_DIR, or taken as they are
#      from a bundle (scripts/make-gpu-bundle.sh; BUNDLE=dir, or this script run from inside one) or SKIP_BUILD=1;
#      every binary the check runs (and any shared module beside them) must exist and load (ldd: nothing "not found");
#      whether harmony-run has plan.mode=resident (a one-step probe; without it the resident runs below are
#      Harmony-PP with one pack and the verdict fails the "resident plan kind" row);
#   2. the CUDA tests (backend_device_conformance with the CUDA device required, backend_cuda_device,
#      backend_adamw_parallel, backend_cuda_index);
#   3. bench_cuda (pinned copy ceiling vs harmony's copies, cuBLAS fp32/TF32/BF16) and bench_adamw;
#   4. one initialisation and one token file for every run (scripts/torch_side_by_side.py init / tokens), then
#      (b) the GPT (default GPT-2 medium, T = 1024) resident, B = 8, STEPS steps, bf16: MFU against the dense BF16
#      peak; PyTorch beside it (scripts/torch_side_by_side.py: same init, tokens, order and AdamW; bf16 autocast,
#      fused AdamW, SDPA): throughput and the loss curve; (b32) resident at MINIBATCH in microbatches of UBATCH;
#      (c) Harmony (--plan auto) at the same minibatch under a quarter of (b32)'s peak, PyTorch at that cap, dp-swap
#      at that cap; bf16 staging rates from (c)'s trace; (d) harmony-sim's a-priori prediction of (c) from a profile
#      taken here; (e) `harmony-sim calibrate` fitted on (b) and (c) dp-swap predicts (c) Harmony; (b) again with
#      --no-fuse for UNFUSED_STEPS steps (the fused kernels on and off);
#   5. losses of every plan kind, CUDA vs the CPU device, fp32 and bf16, --exact, on the serial executor (the CPU device's
#      allocation order), harmony-pp also on the concurrent one (CUDA's default); the same for the Llama family
#      (configs/run/llama.yaml, rows llama_KIND);
#   6. PyTorch with torch.compile, last, within COMPILE_BUDGET_S and what is left of the deadline (optional: the
#      throughput row takes the faster PyTorch run that trained).
# Every command runs under `timeout` cut to the time left; a step the deadline prevents is recorded as such.
#
# usage: scripts/gpu-check.sh OUT_DIR            (from a bundle: BUNDLE/scripts/gpu-check.sh OUT_DIR)
# knobs: GPT2='{vocab_size: 50257, max_seq_len: 1024, n_layer: 24, n_head: 16, n_embd: 1024}' SEQ_LEN=1024
#        BATCH=8 STEPS=20 MINIBATCH=32 UBATCH=8 CAPPED_STEPS=4 UNFUSED_STEPS=6 LR=3e-4 JOBS=$(nproc) BUILD_DIR=build-gpu
#        DEADLINE_S=480 SKIP_BUILD=1 BUNDLE=dir COMPILE_BUDGET_S=120 TORCH_PYTHON=python3
#        PEAK_BF16_TFLOPS=<dense BF16 peak; default by GPU name> FAST=1 (train (b)-(d) with --tf32; tree sums are the default)
#        DEVICE=cpu: a dry run of the plumbing on the CPU device (with an nvidia-smi stand-in on PATH and a tiny GPT2;
#        docs/benchmarks.md): every run that needs no GPU runs for real; its verdict always fails the "device" row
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD

if (($# != 1)); then
  sed -n '2,35p' "$0" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu-check: cannot create $1" >&2; exit 2; }
bundle=${BUNDLE:-}
[[ -z $bundle && -f $root/gpu-bundle.json ]] && bundle=$root  # run from inside a bundle
if [[ -n $bundle ]]; then
  bundle=$(cd "$bundle" && pwd) || { echo "gpu-check: BUNDLE=$BUNDLE is not a folder" >&2; exit 2; }
  [[ -f $bundle/gpu-bundle.json ]] || { echo "gpu-check: $bundle has no gpu-bundle.json (scripts/make-gpu-bundle.sh)" >&2; exit 2; }
fi
build=${BUILD_DIR:-build-gpu}
[[ -n $bundle ]] && build=$bundle/bin
binaries=built
[[ -n $bundle ]] && binaries=bundle
[[ -z $bundle && ${SKIP_BUILD:-0} == 1 ]] && binaries=prebuilt
jobs=${JOBS:-$(nproc)}
gpt2=${GPT2:-'{vocab_size: 50257, max_seq_len: 1024, n_layer: 24, n_head: 16, n_embd: 1024}'}
seq_len=${SEQ_LEN:-1024}
batch=${BATCH:-8}
steps=${STEPS:-20}
minibatch=${MINIBATCH:-32}
ubatch=${UBATCH:-8}
capped_steps=${CAPPED_STEPS:-4}
unfused_steps=${UNFUSED_STEPS:-6}
lr=${LR:-3e-4}
deadline_s=${DEADLINE_S:-480}
dev=${DEVICE:-cuda}
[[ $dev == cuda || $dev == cpu ]] || { echo "gpu-check: DEVICE=$dev: cuda (the check) or cpu (a dry run)" >&2; exit 2; }
compile_budget_s=${COMPILE_BUDGET_S:-120}
torch_py=${TORCH_PYTHON:-python3}
fast=()
[[ ${FAST:-0} == 1 ]] && fast=(--tf32)  # tree sums and the bf16 fast path are harmony-run's default on CUDA
start=$SECONDS
rm -f "$out/steps.jsonl"

# step NAME LIMIT_S CMD...: runs CMD (stdout to NAME.out, stderr to NAME.log) under timeout, cut to the time left
# before the deadline; appends {"name", "rc", "s", "deadline"} to steps.jsonl. rc null: not run (deadline).
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline_s - (SECONDS - start)))
  if ((left <= 0)); then
    printf '{"name": "%s", "rc": null, "s": 0, "deadline": true}\n' "$name" >>"$out/steps.jsonl"
    printf '  %-28s not run: deadline\n' "$name"
    return 1
  fi
  local cut=false
  ((left < limit)) && { limit=$left; cut=true; }
  local t0=$SECONDS rc
  timeout "$limit" "$@" >"$out/$name.out" 2>"$out/$name.log"
  rc=$?
  local hit=false
  [[ $cut == true && ($rc == 124 || $rc == 137) ]] && hit=true
  printf '{"name": "%s", "rc": %d, "s": %d, "deadline": %s}\n' "$name" "$rc" $((SECONDS - t0)) "$hit" \
    >>"$out/steps.jsonl"
  printf '  %-28s rc %d, %d s\n' "$name" "$rc" $((SECONDS - t0))
  return "$rc"
}
# keep NAME: NAME.out as NAME.json (the run's JSON document), when the step wrote one
keep() { [[ -s $out/$1.out ]] && cp "$out/$1.out" "$out/${2:-$1}.json"; }
finish() {
  python3 - "$out" "$gpt2" "$seq_len" "$batch" "${PEAK_BF16_TFLOPS:-}" "$((SECONDS - start))" "${bf16:-false}" \
    "$deadline_s" "$binaries" "$dev" "${resident:-}" "$minibatch" "$ubatch" "$steps" "${cap_kib:-}" <<'PY'
import json, re, sys
(out, gpt2, T, B, peak, elapsed, bf16, deadline, binaries, device, resident, minibatch, ubatch, steps,
 cap) = sys.argv[1:]
g = {k: int(v) for k, v in re.findall(r"(vocab_size|max_seq_len|n_layer|n_head|n_embd):\s*(\d+)", gpt2)}
json.dump({"gpt2": g, "seq_len": int(T), "batch": int(B), "peak_bf16_tflops": float(peak) if peak else None,
           "elapsed_s": int(elapsed), "deadline_s": int(deadline), "bf16_implemented": bf16 == "true",
           "binaries": binaries, "device": device, "resident_implemented": {"true": True, "false": False}.get(resident),
           "minibatch": int(minibatch), "ubatch": int(ubatch), "steps": int(steps), "fsdp_rows": True,
           "extra_loss_kinds": ["zero2", "zero3-opt-offload", "host-stream", "fsdp-offload"],
           "cap_bytes": int(cap) * 1024 if cap else None}, open(f"{out}/params.json", "w"), indent=1)
PY
  echo
  python3 "$root/scripts/gpu_verdict.py" "$out" --markdown "$out/table.md"
  exit $?
}

# --- 0. environment --------------------------------------------------------------------------------------------
nvcc_bin=$(command -v nvcc || true)
[[ -z $nvcc_bin && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [[ -n $nvcc_bin ]]; then
  PATH="$(dirname "$nvcc_bin"):$PATH"
  export PATH
fi
smi_err=""
smi=$(nvidia-smi 2>&1) || smi_err=$(printf '%s' "$smi" | head -n 1)
printf '%s\n' "$smi" >"$out/nvidia-smi.txt"
smi_q() {  # one field of GPU 0, or nothing when nvidia-smi fails (its error text is not a value)
  local v
  [[ -z $smi_err ]] || return 0
  v=$(nvidia-smi --query-gpu="$1" --format=csv,noheader,nounits 2>/dev/null) || return 0
  printf '%s' "$v" | head -n 1
}
gpu_name=$(smi_q name)
cc=$(smi_q compute_cap | tr -d ' ')
driver=$(smi_q driver_version | tr -d ' ')
driver_cuda=""
[[ -z $smi_err ]] && driver_cuda=$(printf '%s' "$smi" | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
toolkit_cuda=""
[[ -n $nvcc_bin ]] && toolkit_cuda=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p' | head -n 1)
# A bundle's binaries were compiled by the toolkit it records; that is the version the driver must support.
[[ -n $bundle ]] && toolkit_cuda=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['cuda_version'])" \
  "$bundle/gpu-bundle.json" 2>/dev/null)
cuda_root=$([[ -n $nvcc_bin ]] && cd "$(dirname "$nvcc_bin")/.." && pwd)
# Where CUDA's libraries may be besides the loader cache: the toolkit, the usual install folders, and the nvidia-*
# wheels a pip PyTorch brings (site-packages/nvidia/*/lib).
cuda_dirs=()
[[ -n $cuda_root ]] && cuda_dirs+=("$cuda_root"/lib64 "$cuda_root"/targets/*/lib)
cuda_dirs+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/*/lib)
while IFS= read -r d; do cuda_dirs+=("$d"); done < <("$torch_py" -c \
  'import nvidia, os; [print(os.path.join(p, d, "lib")) for p in nvidia.__path__ for d in sorted(os.listdir(p))]' \
  2>/dev/null)
extra_dirs=()
l_cudart="" l_cublas="" l_cublaslt="" l_nccl=""
lib() {  # lib VAR NAME: VAR = the library's path from the loader cache or those folders, or nothing (a folder found
  local p="" d  # outside the cache goes on LD_LIBRARY_PATH below, so that the binaries load from it too)
  p=$(ldconfig -p 2>/dev/null | awk -v l="$2" '$1 ~ "^"l"\\.so" {print $NF; exit}')
  if [[ -z $p ]]; then
    for d in "${cuda_dirs[@]}"; do
      p=$(ls "$d/$2".so* 2>/dev/null | head -n 1)
      [[ -n $p ]] && { extra_dirs+=("$d"); break; }
    done
  fi
  printf -v "$1" '%s' "$p"
}
lib l_cudart libcudart
lib l_cublas libcublas
lib l_cublaslt libcublasLt
lib l_nccl libnccl
for d in "${extra_dirs[@]}"; do
  case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
done
# A bundle's compiler runtime (lib/runtime: Debian 12's libstdc++ and libgcc_s, which need GLIBC_2.36) only where
# the system's is too old for the binaries (scripts/make-gpu-bundle.sh says why it is not on their RUNPATH).
runtime=system
if [[ -n $bundle && -d $bundle/lib/runtime ]] &&
  LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} ldd "$build/apps/harmony-run" "$build/sim/harmony-sim" 2>&1 |
  grep -qE "(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found|lib(stdc\+\+|gcc_s)[^ ]* => not found"; then
  LD_LIBRARY_PATH="$bundle/lib/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  runtime=bundle
fi
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
python3 - "$out/env.json" "$nvcc_bin" "$toolkit_cuda" "$driver" "$driver_cuda" "$gpu_name" "$cc" "$smi_err" \
  "$l_cudart" "$l_cublas" "$l_cublaslt" "$l_nccl" "$bundle" "$LD_LIBRARY_PATH" "$runtime" \
  "$(ldd --version 2>/dev/null | head -n 1)" <<'PY'
import json, sys
f, nvcc, tk, drv, dcuda, gpu, cc, err, cudart, cublas, cublaslt, nccl, bundle, ldpath, runtime, glibc = sys.argv[1:]
n = lambda s: s or None
json.dump({"nvcc": n(nvcc), "toolkit_cuda": n(tk), "driver": n(drv), "driver_cuda": n(dcuda), "gpu": n(gpu),
           "compute_cap": n(cc), "nvidia_smi_error": n(err),
           "libs": {"libcudart": n(cudart), "libcublas": n(cublas), "libcublasLt": n(cublaslt), "libnccl": n(nccl)},
           "bundle": n(bundle), "ld_library_path": n(ldpath), "cxx_runtime": runtime, "glibc": n(glibc)},
          open(f, "w"), indent=1)
PY
echo "gpu-check: ${gpu_name:-no GPU} (sm_${cc//./}), driver ${driver:-?} (CUDA ${driver_cuda:-?}), " \
  "${bundle:+bundle $bundle, }nvcc ${nvcc_bin:-not found} (CUDA ${toolkit_cuda:-?}); results in $out"
if [[ (-z $nvcc_bin && -z $bundle) || -z $gpu_name || -z $driver_cuda || -z $toolkit_cuda ]] ||
  ! python3 -c "import sys; v=lambda s: tuple(map(int, s.split('.')[:2])); sys.exit(v(sys.argv[1]) < v(sys.argv[2]))" \
    "$driver_cuda" "$toolkit_cuda"; then
  finish  # the verdict names what is missing
fi
archs=90
[[ ${cc//./} != 90 ]] && archs="90,${cc//./}"

# --- 1. the binaries ------------------------------------------------------------------------------------------------
run="$build/apps/harmony-run"
sim="$build/sim/harmony-sim"
# Every binary the check runs, and every shared module built beside them (a dlopen()ed device, say): present,
# executable, and every library ldd names resolves (on the GPU machine: CUDA's, the driver's and glibc's from the
# system, the rest from the bundle's lib/).
check_script='status=0 n=0
files=("$1"/apps/harmony-run "$1"/sim/harmony-sim "$1"/bench/bench_cuda "$1"/bench/bench_adamw
  "$1"/tests/test_backend_device_conformance "$1"/tests/test_backend_cuda_device "$1"/tests/test_backend_adamw_parallel
  "$1"/tests/test_backend_cuda_index)
while IFS= read -r -d "" m; do files+=("$m"); done < <(find "$1" -name "*.so" -not -path "*/meson-private/*" \
  -not -path "*.p/*" -print0 2>/dev/null)
for f in "${files[@]}"; do
  n=$((n + 1))
  if [[ ! -f $f || ( $f != *.so && ! -x $f ) ]]; then echo "error: $f: missing or not executable" >&2; status=1; continue; fi
  bad=$(ldd "$f" 2>&1 | grep -E "not found|not a dynamic|No such file")
  [[ -n $bad ]] && { echo "error: $f: $(echo $bad)" >&2; status=1; }
done
((status == 0)) && echo "$n binaries and modules present, every library resolves (ldd)"
exit $status'
build_script='set -e
setup=(-Dbuildtype=release -Dcuda=enabled "-Dgpu_arch=$1" -Dfuzz=disabled)
if [[ -f $2/meson-private/coredata.dat ]]; then meson setup --reconfigure "$2" "${setup[@]}"; else meson setup "$2" "${setup[@]}"; fi
ninja -C "$2" -j "$3" tests/test_backend_device_conformance tests/test_backend_cuda_device \
  tests/test_backend_adamw_parallel tests/test_backend_cuda_index bench/bench_cuda bench/bench_adamw apps/harmony-run \
  sim/harmony-sim
bash -c "$4" check "$2"'
if [[ $binaries == built ]]; then
  for tool in meson ninja; do
    command -v "$tool" >/dev/null 2>&1 || { echo "gpu-check: $tool not found" >&2; exit 2; }
  done
  echo "== build ($build, sm_{$archs})"
  step build 420 bash -c "$build_script" build "$archs" "$build" "$jobs" "$check_script"
else
  echo "== binaries ($binaries: $build)"
  step build 30 bash -c "$check_script" check "$build"
fi || finish
# bf16 counts as implemented when a short bf16 run trains on the CUDA device (a --dtype flag alone proves
# nothing: the flag also serves the CPU device); the CUDA device's bf16 kernels (CudaKernels<Bf16>) make it train,
# and (b)-(d) then train in bf16. A device without bf16 kernels fails this step at setup ("bf16 not supported").
bf16=false
dtype=()
if "$run" train --help 2>/dev/null | grep -q -- '--dtype'; then
  step bf16_cuda 60 "$run" train configs/run/default.yaml --steps 2 --set "device=$dev" --dtype bf16 --quiet &&
    bf16=true && dtype=(--dtype bf16)
fi
# plan.mode=resident (weights, gradients and AdamW state on the device): the in-memory reference. Until
# harmony-run has it, (b) and (b32) run Harmony-PP with every layer in one pack on one GPU (AdamW on the host).
layers=$(python3 -c "import re,sys; print(int(re.search(r'n_layer:\s*(\d+)', sys.argv[1]).group(1)) + 2)" "$gpt2")
resident_plan() {  # resident_plan MINIBATCH UBATCH LAYERS
  if [[ ${resident:-} == true ]]; then
    echo "{mode: resident, gpus: 1, minibatch: $1, u_fwd: $2, u_bwd: $2}"
  else
    echo "{mode: harmony-pp, gpus: 1, minibatch: $1, u_fwd: $2, u_bwd: $2, pack_size: $3}"
  fi
}
resident=true
cat >"$out/resident_small.yaml" <<EOF
# Written by scripts/gpu-check.sh: configs/run/default.yaml's model and data, trained resident on one device.
model: {gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}, seq_len: 32, init_seed: 1}
machine: {preset: cpu-4x, gpu_memory: 64MiB}
device: $dev
plan: $(resident_plan 8 8 10)
train: {steps: 3, lr: 3e-3, weight_decay: 0.0, data: {synthetic_tokens: 65536, seed: 1}}
EOF
step resident_probe 60 "$run" train "$out/resident_small.yaml" --steps 1 --quiet || resident=false

# --- 2. tests ---------------------------------------------------------------------------------------------------
echo "== tests"
# The conformance suite checks every device kind the registry finds (backend/registry.hpp): the CUDA device through
# its module, which it must find and load here (HARMONY_CONFORMANCE_REQUIRE: a missing GPU or module fails the step
# instead of skipping the kind).
require=""
[[ $dev == cuda ]] && require=cuda
HARMONY_SOURCE_DIR=$root HARMONY_CUDA_MODULE=$build/apps/libharmony-cuda.so HARMONY_CONFORMANCE_REQUIRE=$require \
  step test_backend_device_conformance 240 "$build/tests/test_backend_device_conformance"
for t in backend_cuda_device backend_adamw_parallel backend_cuda_index; do
  HARMONY_SOURCE_DIR=$root step "test_$t" 240 "$build/tests/test_$t"
done

# --- 3. microbenchmarks ------------------------------------------------------------------------------------------
echo "== benches"
step bench_cuda 90 "$build/bench/bench_cuda" --json && cp "$out/bench_cuda.out" "$out/bench_cuda.json"
step bench_adamw 60 "$build/bench/bench_adamw" --params 33554432 --repeats 3 &&
  cp "$out/bench_adamw.out" "$out/bench_adamw.txt"

# --- 4. training ---------------------------------------------------------------------------------------------------
h2d=$(python3 -c "import json; print(json.load(open('$out/bench_cuda.json'))['h2d_device_GBps'])" 2>/dev/null || echo 25)
free_mib=$(smi_q memory.free | tr -d ' ')
big="$((free_mib - 4096))MiB"  # less 4 GiB for the CUDA context, cuBLAS and the streams' workspaces
# gpu_rates.memory: the device memory bandwidth the resident kind's on-GPU AdamW is priced by (sim::gpu_update; without
# it (e) cannot price (b) and fails). Measured with PyTorch on this GPU (a 1 GiB device-to-device copy, best of 5,
# read + write bytes); else the datasheet's HBM rate of the GPU named (H100 SXM 3.35 TB/s, H200 4.8 TB/s: NVIDIA's
# H100 and H200 datasheets); else 2 TB/s, marked assumed in the file.
mem_bw=$("$torch_py" - 2>/dev/null <<'PY'
import time, torch
if not torch.cuda.is_available():
    raise SystemExit(1)
a = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
b = torch.empty_like(a)
best = 0.0
for _ in range(6):
    torch.cuda.synchronize()
    t = time.perf_counter()
    b.copy_(a)
    torch.cuda.synchronize()
    best = max(best, 2 * a.numel() * 4 / (time.perf_counter() - t))
print(f"{best / 1e9:.0f}")
PY
) && mem_src="measured here with PyTorch (1 GiB device copy, best of 5)"
if [[ -z ${mem_bw:-} ]]; then
  case $gpu_name in
    *H200*) mem_bw=4800 mem_src="NVIDIA H200 datasheet (HBM3e)" ;;
    *H100*) mem_bw=3350 mem_src="NVIDIA H100 SXM datasheet (HBM3)" ;;
    *) mem_bw=2000 mem_src="ASSUMED (no PyTorch CUDA, GPU not in the table)" ;;
  esac
fi
# gpu_rates needs matrix_fp32 beside memory; it prices analytic models only (the runs here are priced on a measured
# profile), so the datasheet's FP32 rate (67 TFLOP/s for H100 SXM and H200) or an assumed one.
case $gpu_name in
  *H100* | *H200*) fp32_tflops=67 ;;
  *) fp32_tflops=20 ;;
esac
cat >"$out/machine-base.yaml" <<EOF
# Written by scripts/gpu-check.sh: one $gpu_name, the host link at harmony's measured pinned H2D rate.
name: gpu-check
gpu: $gpu_name
gpus: 1
gpu_memory: $big
memory_cap_scale: 1.0
bw_swap: ${h2d}GB/s
bw_p2p: ${h2d}GB/s
bw_msg: 16GiB/s
time_del: 0s
gpu_rates: {matrix_fp32: ${fp32_tflops}TFLOP/s, memory: ${mem_bw}GB/s}  # memory: $mem_src
EOF
# machine.yaml, what every prediction below prices on: machine-base.yaml plus what `harmony-run probe` measures here
# (host_paths: pinned copies and the bf16 staging end to end, which the native model caps each host transfer at;
# the CPU AdamW rates; docs/machines.md "Measuring a machine"). Without a probe, the base alone.
step probe 60 "$run" probe --device "$dev" --base "$out/machine-base.yaml" --out "$out/machine.yaml" --quiet ||
  cp "$out/machine-base.yaml" "$out/machine.yaml"
# One initialisation and one token stream for harmony-run and PyTorch alike: the weights as a safetensors file
# (GPT-2's scheme), the tokens harmony-run's synthetic task written out (the same stream it would draw itself).
echo "== the model and the tokens for both tools"
gpt2_key() { python3 -c "import re,sys; print(re.search(sys.argv[2] + r':\s*(\d+)', sys.argv[1]).group(1))" "$gpt2" "$1"; }
vocab=$(gpt2_key vocab_size)
shape_args=(--vocab-size "$vocab" --n-positions "$(gpt2_key max_seq_len)" --n-layer "$(gpt2_key n_layer)"
  --n-head "$(gpt2_key n_head)" --n-embd "$(gpt2_key n_embd)")
ntokens=$(( (steps * batch > capped_steps * minibatch ? steps * batch : capped_steps * minibatch) * seq_len + 1 ))
tbs=("$torch_py" "$root/scripts/torch_side_by_side.py")
step torch_tokens 60 python3 "$root/scripts/torch_side_by_side.py" tokens --vocab-size "$vocab" --count "$ntokens" \
  --seed 1 --out "$out/tokens.bin"
step torch_init 120 "${tbs[@]}" init "${shape_args[@]}" --seed 1 --out "$out/init.safetensors"
model_yaml="  gpt2: $gpt2
  init_seed: 1"
[[ -s $out/init.safetensors ]] && model_yaml="  weights: $out/init.safetensors"
data_yaml="{synthetic_tokens: $ntokens, seed: 1}"
[[ -s $out/tokens.bin ]] && data_yaml=$out/tokens.bin
# write_config NAME PLAN STEPS [GPU_MEMORY]: the GPT of (b)-(e) on the CUDA device with this plan
write_config() {
  cat >"$out/$1.yaml" <<EOF
# Written by scripts/gpu-check.sh: the GPT of (b)-(e), trained on the CUDA device.
model:
$model_yaml
  seq_len: $seq_len
machine: {file: $out/machine.yaml, gpu_memory: ${4:-$big}}
device: $dev
cost_model: native
plan: $2
train: {steps: $3, lr: $lr, weight_decay: 0.0, data: $data_yaml}
EOF
}
write_config gpt "$(resident_plan "$batch" "$batch" "$layers")" "$steps"
write_config b32 "$(resident_plan "$minibatch" "$ubatch" "$layers")" "$capped_steps"
torch_common=(--weights "$out/init.safetensors" --data "$out/tokens.bin" --seq-len "$seq_len" --lr "$lr"
  --weight-decay 0 --dtype bf16 --device "$dev" ${PEAK_BF16_TFLOPS:+--peak-tflops "$PEAK_BF16_TFLOPS"})

# (d) first: the profile every run below is priced on (harmony-run's prediction beside each run, --plan auto's
# ranking, harmony-sim's a-priori prediction of (c)), at the one microbatch size they all use.
echo "== (d) profile at microbatch $ubatch"
step d_profile 90 "$run" profile "$out/gpt.yaml" "${fast[@]}" "${dtype[@]}" --out "$out/profile.json" --repeats 3 \
  --ubatch "$ubatch"
prof=()
[[ -s $out/profile.json ]] && prof=(--set "model.profile=$out/profile.json")
echo "== (b) resident, B = $batch, $steps steps; PyTorch beside it"
step b_in_memory 150 "$run" train "$out/gpt.yaml" "${fast[@]}" "${dtype[@]}" "${prof[@]}" --format json --quiet \
  --trace "$out/b.trace.json" && keep b_in_memory b
step t_torch 150 "${tbs[@]}" train "${torch_common[@]}" --batch "$batch" --steps "$steps" && keep t_torch
echo "== (b32) resident at minibatch $minibatch in microbatches of $ubatch"
step b32 120 "$run" train "$out/b32.yaml" "${fast[@]}" "${dtype[@]}" "${prof[@]}" --format json --quiet && keep b32
# (KiB: a quarter of a small model's peak, e.g. a dry run's, may be under one MiB)
cap_kib=$(python3 -c "import json; print(json.load(open('$out/b32.json'))['summary']['peak_memory_bytes'] // 4 // 1024)" \
  2>/dev/null || echo 0)
write_config capped "{mode: harmony-pp, gpus: 1, minibatch: $minibatch, u_fwd: $ubatch, u_bwd: $ubatch}" \
  "$capped_steps" "${cap_kib}KiB"
write_config dpswap "{mode: dp-swap, gpus: 1, minibatch: $batch, u_fwd: $ubatch, u_bwd: $ubatch}" \
  "$capped_steps" "${cap_kib}KiB"
only_u=(--set "search.u_fwd=[$ubatch]" --set "search.u_bwd=[$ubatch]")
echo "== (c) capped to a quarter of (b32): $cap_kib KiB"
step c_auto 120 "$run" train "$out/capped.yaml" "${fast[@]}" "${dtype[@]}" --plan auto "${only_u[@]}" "${prof[@]}" \
  --format json --quiet --trace "$out/c_auto.trace.json" && keep c_auto
step t_torch_cap 90 "${tbs[@]}" train "${torch_common[@]}" --batch "$minibatch" --microbatch "$ubatch" \
  --steps "$capped_steps" --memory-cap $((cap_kib * 1024)) && keep t_torch_cap
step c_dpswap 90 "$run" train "$out/dpswap.yaml" "${fast[@]}" "${dtype[@]}" --plan auto "${only_u[@]}" "${prof[@]}" \
  --format json --quiet --trace "$out/c_dpswap.trace.json" && keep c_dpswap
if [[ -f $out/c_auto.json ]]; then
  python3 - "$out" "$cap_kib" >"$out/sim.yaml" <<'PY'
import json, sys
out, cap = sys.argv[1], sys.argv[2]
p = json.load(open(f"{out}/c_auto.json"))["plan"]  # packs: [[first, last], ...] (docs/output-schema.md)
print(f"model: {{profile: {out}/profile.json}}")
print(f"machine: {{file: {out}/machine.yaml, gpu_memory: {cap}KiB}}")
print("cost_model: native")
print(f"plan: {{mode: {p['plan_kind']}, gpus: {p['gpus']}, minibatch: {p['minibatch']}, u_fwd: {p['u_fwd']}, "
      f"u_bwd: {p['u_bwd']}, packs_bwd: {json.dumps(p['packs_bwd'])}, packs_fwd: {json.dumps(p['packs_fwd'])}}}")
PY
  # The run fitted the cap; when harmony-sim's memory account says it does not (d_sim exits 2, recorded in
  # steps.jsonl), the same Program is priced again without the cap binding, so (d) still has its time prediction.
  if step d_sim 30 "$sim" simulate "$out/sim.yaml" --format json; then
    cp "$out/d_sim.out" "$out/d_sim.json"
  else
    step d_sim_uncapped 30 "$sim" simulate "$out/sim.yaml" --set "machine.gpu_memory=$big" --format json &&
      cp "$out/d_sim_uncapped.out" "$out/d_sim.json"
  fi
fi

# (e) calibrate on (b) and (c) dp-swap, predict (c) Harmony. Each run's Program as a harmony-run config: gpt.yaml
# with the measured profile, the run's memory cap and the plan it trained (from its JSON), so calibrate lowers
# exactly the Program the trace recorded (flags like --tf32 change kernels, not the Program).
echo "== (e) calibrate on (b) + (c) dp-swap, predict (c) Harmony"
program_config() {  # program_config RUN_JSON CAP ("" = gpt.yaml's memory) > CONFIG
  python3 - "$out" "$1" "$2" <<'PY'
import json, re, sys
out, run, cap = sys.argv[1:]
p = json.load(open(run))["plan"]
kind = p["plan_kind"]
plan = f"mode: {kind}, gpus: {p['gpus']}, minibatch: {p['minibatch']}, u_fwd: {p['u_fwd']}, u_bwd: {p['u_bwd']}"
if kind.startswith("harmony"):
    plan += f", packs_bwd: {json.dumps(p['packs_bwd'])}, packs_fwd: {json.dumps(p['packs_fwd'])}"
text = open(f"{out}/gpt.yaml").read()
text = text.replace("model:\n", f"model:\n  profile: {out}/profile.json\n", 1)
if cap:
    text = re.sub(r"gpu_memory: [^}]*}", f"gpu_memory: {cap}}}", text, count=1)
text = re.sub(r"^plan: .*$", "plan: {" + plan + "}", text, count=1, flags=re.M)
print(f"# Written by gpu-check.sh: the Program {run} trained, for harmony-sim calibrate.")
print(text.rstrip())
PY
}
calibrated=false
if [[ -f $out/b.json && -f $out/b.trace.json && -f $out/c_dpswap.json && -f $out/c_dpswap.trace.json ]]; then
  program_config "$out/b.json" "" >"$out/e_b.yaml" &&
    program_config "$out/c_dpswap.json" "${cap_kib}KiB" >"$out/e_dpswap.yaml" &&
    step e_calibrate 60 "$sim" calibrate "$out/machine.yaml" \
      --run "$out/e_b.yaml,$out/b.trace.json,$out/b.json" \
      --run "$out/e_dpswap.yaml,$out/c_dpswap.trace.json,$out/c_dpswap.json" \
      --out "$out/machine-calibrated.yaml" --format json && cp "$out/e_calibrate.out" "$out/e_calibrate.json" &&
    calibrated=true
fi
if [[ $calibrated == true && -f $out/c_auto.json && -f $out/c_auto.trace.json ]]; then
  program_config "$out/c_auto.json" "${cap_kib}KiB" >"$out/e_auto.yaml" &&
    step e_predict 60 "$sim" calibrate "$out/machine-calibrated.yaml" \
      --run "$out/e_auto.yaml,$out/c_auto.trace.json,$out/c_auto.json" --check --format json &&
    cp "$out/e_predict.out" "$out/e_predict.json"
fi

# (b) again with --no-fuse (the unfused kernels: no cuBLASLt GELU epilogues, no fused residual add + LayerNorm; issue
# 34), UNFUSED_STEPS steps (the first is warm-up): the verdict compares its step time and losses with (b)'s.
echo "== (b) with --no-fuse, $unfused_steps steps"
step b_unfused 90 "$run" train "$out/gpt.yaml" "${fast[@]}" "${dtype[@]}" "${prof[@]}" --steps "$unfused_steps" \
  --no-fuse --format json --quiet --trace "$out/b_unfused.trace.json" && keep b_unfused

# --- 5. losses ------------------------------------------------------------------------------------------------------
# --exact on both devices (strict-order reductions, the bf16 exact kernels: the CPU device's bits, which the bounds
# assume; (b)-(d) train on the fast default). The serial executor on both devices: one op at a time, so the CUDA device allocates in the CPU device's order
# (the concurrent executor's order follows timing: dp-swap's fp32 Program fragmented past 4 MiB in every H200 run);
# harmony-pp once more on the concurrent executor, CUDA's default, against the same CPU run. Then the same rows for
# the Llama family (configs/run/llama.yaml: RMSNorm, rotary embeddings over grouped-query heads, SwiGLU), tagged
# llama_KIND: the CUDA device's Llama kernels against the CPU device's.
echo "== losses of every plan kind, CUDA vs CPU (3 steps, serial executor, strict fp32; then bf16; GPT-2, then Llama)"
kinds=(harmony-pp harmony-dp pp-swap dp-swap zero-infinity zero-offload l2l lohan fsdp zero2 zero3-opt-offload host-stream
  fsdp-offload)
[[ $resident == true ]] && kinds+=(resident)
loss_run() {  # loss_run TAG KIND cuda|cpu EXECUTOR gpt2|llama PREC_ARGS...
  local tag=$1 kind=$2 dev_=$3 ex=$4 family=$5
  shift 5
  local model=configs/run/default.yaml
  [[ $family == llama ]] && model=configs/run/llama.yaml
  local cfg=("$model" --set "plan.mode=$kind" --set plan.gpus=2 --gpu-memory 4MiB)
  [[ $kind == lohan ]] && cfg+=(--set plan.u_fwd=4 --set plan.u_bwd=4)  # lohan: one microbatch per GPU (D/N = 8/2)
  # fsdp keeps half the model's weights, gradients and AdamW state on each of its two devices; zero2 the whole weights
  # and half the rest (its ShardStates with whole weights: the all-gather after the update, device to device)
  [[ $kind == fsdp || $kind == zero2 ]] && cfg=("$model" --set "plan.mode=$kind" --set plan.gpus=2 --gpu-memory 64MiB)
  # host-stream runs on one GPU: in 4 MiB some layers stay (their update in place) and some stream
  [[ $kind == host-stream ]] && cfg=("$model" --set plan.mode=host-stream --set plan.gpus=1 --gpu-memory 4MiB)
  if [[ $kind == resident && $family == gpt2 ]]; then
    cfg=("$out/resident_small.yaml")
  elif [[ $kind == resident ]]; then  # llama.yaml on one device of 64 MiB, as resident_small.yaml
    cfg=("$model" --set plan.mode=resident --set plan.gpus=1 --set plan.u_fwd=8 --set plan.u_bwd=8 --gpu-memory 64MiB)
  fi
  local on=$dev_  # the "cuda" side runs on $dev (the CPU device in a dry run)
  [[ $dev_ == cuda ]] && on=$dev
  step "loss_${tag}_$dev_" 30 "$run" train "${cfg[@]}" --steps 3 --exact "$@" --set "device=$on" --executor "$ex" \
    --format json --quiet && keep "loss_${tag}_$dev_"
}
for family in gpt2 llama; do
  for kind in "${kinds[@]}"; do
    for prec in fp32 bf16; do
      [[ $prec == bf16 && $bf16 != true ]] && continue
      tag=$kind
      [[ $family == llama ]] && tag=llama_$kind
      prec_args=()
      [[ $prec == bf16 ]] && tag=bf16_$tag && prec_args=(--dtype bf16)
      for side in cuda cpu; do
        loss_run "$tag" "$kind" "$side" serial "$family" ${prec_args[@]+"${prec_args[@]}"}
      done
    done
  done
  [[ $family == gpt2 ]] && loss_run concurrent_harmony-pp harmony-pp cuda concurrent gpt2
done

# --- 6. PyTorch with torch.compile (optional; what is left of the deadline) ---------------------------------------
# (its limit leaves 15 s of the deadline for the verdict, so that a compile the deadline cuts off fails no row)
echo "== PyTorch with torch.compile (budget $compile_budget_s s)"
limit=$((deadline_s - (SECONDS - start) - 15))
((limit > compile_budget_s + 60)) && limit=$((compile_budget_s + 60))
((limit > 0)) && step t_torch_compile "$limit" "${tbs[@]}" train "${torch_common[@]}" --batch "$batch" \
  --steps "$steps" --compile --compile-budget-s "$compile_budget_s" && keep t_torch_compile
finish
