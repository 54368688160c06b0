#!/usr/bin/env bash
# The CUDA device's check on a machine with an NVIDIA GPU (issue 15): runs everything within one deadline
# (DEADLINE_S, default 480 s, build included) and records every output in OUT_DIR; the verdict, one table with
# PASSED / FAILED / SKIPPED per check, is scripts/gpu_verdict.py's (tested in CI on recorded outputs). Steps:
#   0. environment: nvcc (PATH or /usr/local/cuda/bin), the driver's CUDA version against the toolkit's, the GPU,
#      cudart/cuBLAS/NCCL -> env.json (a failure here stops the check: nothing else can be meaningful);
#   1. build (release, -Dcuda=enabled, sm_90 plus the local GPU's) in $BUILD_DIR (default build-gpu/);
#   2. the CUDA tests (backend_cuda_device, backend_adamw_parallel, backend_cuda_index);
#   3. bench_cuda (pinned copy ceiling vs harmony's copies, cuBLAS fp32/TF32/BF16) and bench_adamw;
#   4. (b) a GPT-2 of >= 350M parameters at T = 1024 trained in memory (MFU against the dense BF16 peak),
#      (c) the same under a quarter of (b)'s memory, --plan auto (Harmony) and dp-swap, (d) harmony-sim's
#      a-priori prediction of (c) from a profile taken here, (e) the loop closed (docs/validation.md#calibrate):
#      `harmony-sim calibrate` fits this GPU's machine file to the traces of (b) and (c) dp-swap, then predicts
#      (c) Harmony, a Program it was not fitted on; losses of every plan kind on CUDA vs the CPU device, in fp32
#      and (when the CUDA device trains bf16) in bf16 against the CPU device's bf16 emulation.
# Every command runs under `timeout` cut to the time left; a step the deadline prevents is recorded as such.
#
# usage: scripts/gpu-check.sh OUT_DIR
# knobs: GPT2='{vocab_size: 50257, max_seq_len: 1024, n_layer: 24, n_head: 16, n_embd: 1024}' SEQ_LEN=1024
#        BATCH=8 STEPS=4 JOBS=$(nproc) BUILD_DIR=build-gpu DEADLINE_S=480 SKIP_BUILD=1 (binaries as they are)
#        PEAK_BF16_TFLOPS=<dense BF16 peak; default by GPU name> FAST=1 (train (b)-(d) with --tf32 --tree-sums)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD

if (($# != 1)); then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu-check: cannot create $1" >&2; exit 2; }
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
gpt2=${GPT2:-'{vocab_size: 50257, max_seq_len: 1024, n_layer: 24, n_head: 16, n_embd: 1024}'}
seq_len=${SEQ_LEN:-1024}
batch=${BATCH:-8}
steps=${STEPS:-4}
deadline_s=${DEADLINE_S:-480}
fast=()
[[ ${FAST:-0} == 1 ]] && fast=(--tf32 --tree-sums)
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
finish() {
  python3 - "$out" "$gpt2" "$seq_len" "$batch" "${PEAK_BF16_TFLOPS:-}" "$((SECONDS - start))" "${bf16:-false}" \
    "$deadline_s" <<'PY'
import json, re, sys
out, gpt2, T, B, peak, elapsed, bf16, deadline = sys.argv[1:]
g = {k: int(v) for k, v in re.findall(r"(vocab_size|max_seq_len|n_layer|n_head|n_embd):\s*(\d+)", gpt2)}
json.dump({"gpt2": g, "seq_len": int(T), "batch": int(B), "peak_bf16_tflops": float(peak) if peak else None,
           "elapsed_s": int(elapsed), "deadline_s": int(deadline), "bf16_implemented": bf16 == "true"}, open(f"{out}/params.json", "w"), indent=1)
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
cuda_root=$([[ -n $nvcc_bin ]] && cd "$(dirname "$nvcc_bin")/.." && pwd)
lib() {  # the library's path from the loader cache or the toolkit, or nothing
  local p
  p=$(ldconfig -p 2>/dev/null | awk -v l="$1" '$1 ~ "^"l"\\.so" {print $NF; exit}')
  [[ -z $p && -n $cuda_root ]] && p=$(ls "$cuda_root"/lib64/"$1".so* "$cuda_root"/targets/*/lib/"$1".so* 2>/dev/null | head -n 1)
  printf '%s' "$p"
}
python3 - "$out/env.json" "$nvcc_bin" "$toolkit_cuda" "$driver" "$driver_cuda" "$gpu_name" "$cc" "$smi_err" \
  "$(lib libcudart)" "$(lib libcublas)" "$(lib libcublasLt)" "$(lib libnccl)" <<'PY'
import json, sys
f, nvcc, tk, drv, dcuda, gpu, cc, err, cudart, cublas, cublaslt, nccl = sys.argv[1:]
n = lambda s: s or None
json.dump({"nvcc": n(nvcc), "toolkit_cuda": n(tk), "driver": n(drv), "driver_cuda": n(dcuda), "gpu": n(gpu),
           "compute_cap": n(cc), "nvidia_smi_error": n(err),
           "libs": {"libcudart": n(cudart), "libcublas": n(cublas), "libcublasLt": n(cublaslt), "libnccl": n(nccl)}},
          open(f, "w"), indent=1)
PY
echo "gpu-check: ${gpu_name:-no GPU} (sm_${cc//./}), driver ${driver:-?} (CUDA ${driver_cuda:-?}), nvcc ${nvcc_bin:-not found} (CUDA ${toolkit_cuda:-?}); results in $out"
if [[ -z $nvcc_bin || -z $gpu_name || -z $driver_cuda || -z $toolkit_cuda ]] ||
  ! python3 -c "import sys; v=lambda s: tuple(map(int, s.split('.')[:2])); sys.exit(v(sys.argv[1]) < v(sys.argv[2]))" \
    "$driver_cuda" "$toolkit_cuda"; then
  finish  # the verdict names what is missing
fi
for tool in meson ninja; do
  command -v "$tool" >/dev/null 2>&1 || { echo "gpu-check: $tool not found" >&2; exit 2; }
done
archs=90
[[ ${cc//./} != 90 ]] && archs="90,${cc//./}"

# --- 1. build ---------------------------------------------------------------------------------------------------
# (a script of its own for `timeout`; meson setup --reconfigure when the build folder exists)
build_script='set -e
setup=(-Dbuildtype=release -Dcuda=enabled "-Dgpu_arch=$1" -Dfuzz=disabled)
if [[ -f $2/meson-private/coredata.dat ]]; then meson setup --reconfigure "$2" "${setup[@]}"; else meson setup "$2" "${setup[@]}"; fi
ninja -C "$2" -j "$3" tests/test_backend_cuda_device tests/test_backend_adamw_parallel tests/test_backend_cuda_index \
  bench/bench_cuda bench/bench_adamw apps/harmony-run sim/harmony-sim'
echo "== build ($build, sm_{$archs})"
if [[ ${SKIP_BUILD:-0} == 1 ]]; then
  step build 10 test -x "$build/apps/harmony-run" -a -x "$build/bench/bench_cuda"
else
  step build 420 bash -c "$build_script" build "$archs" "$build" "$jobs"
fi || finish
run="$build/apps/harmony-run"
sim="$build/sim/harmony-sim"
# bf16 counts as implemented when a short bf16 run trains on the CUDA device (a --dtype flag alone proves
# nothing: the flag also serves the CPU device); the CUDA device's bf16 kernels (CudaBf16Kernels) make it train,
# and (b)-(d) then train in bf16. A device without bf16 kernels fails this step at setup ("bf16 not supported").
bf16=false
dtype=()
if "$run" train --help 2>/dev/null | grep -q -- '--dtype'; then
  step bf16_cuda 60 "$run" train configs/run/default.yaml --steps 2 --set device=cuda --dtype bf16 --quiet &&
    bf16=true && dtype=(--dtype bf16)
fi

# --- 2. tests ---------------------------------------------------------------------------------------------------
echo "== tests"
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
cat >"$out/machine.yaml" <<EOF
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
EOF
layers=$(python3 -c "import re,sys; print(int(re.search(r'n_layer:\s*(\d+)', sys.argv[1]).group(1)) + 2)" "$gpt2")
cat >"$out/gpt.yaml" <<EOF
# Written by scripts/gpu-check.sh: the GPT of (b)-(d), trained on the CUDA device.
model:
  gpt2: $gpt2
  seq_len: $seq_len
  init_seed: 1
machine: {file: $out/machine.yaml, gpu_memory: $big}
device: cuda
cost_model: native
# One pack of every layer on one GPU: weights, activations and gradients stay resident (the in-memory reference).
plan: {mode: harmony-pp, gpus: 1, minibatch: $batch, u_fwd: $batch, u_bwd: $batch, pack_size: $layers}
train: {steps: $steps, lr: 3e-4, weight_decay: 0.0, data: {synthetic_tokens: 1048576, seed: 1}}
EOF

echo "== (b) in memory"
step b_in_memory 120 "$run" train "$out/gpt.yaml" "${fast[@]}" "${dtype[@]}" --format json --quiet --trace "$out/b.trace.json" &&
  cp "$out/b_in_memory.out" "$out/b.json"
cap_mib=$(python3 -c "import json; print(json.load(open('$out/b.json'))['summary']['peak_memory_bytes'] // 4 // 2**20)" \
  2>/dev/null || echo 0)
echo "== (d) profile, (c) capped to a quarter: $cap_mib MiB"
step d_profile 90 "$run" profile "$out/gpt.yaml" "${fast[@]}" "${dtype[@]}" --out "$out/profile.json" --repeats 3
step c_auto 90 "$run" train "$out/gpt.yaml" "${fast[@]}" "${dtype[@]}" --plan auto --gpu-memory "${cap_mib}MiB" \
  --set "model.profile=$out/profile.json" --format json --quiet --trace "$out/c_auto.trace.json" &&
  cp "$out/c_auto.out" "$out/c_auto.json"
step c_dpswap 90 "$run" train "$out/gpt.yaml" "${fast[@]}" "${dtype[@]}" --plan auto --gpu-memory "${cap_mib}MiB" \
  --set "model.profile=$out/profile.json" --set plan.mode=dp-swap --format json --quiet \
  --trace "$out/c_dpswap.trace.json" && cp "$out/c_dpswap.out" "$out/c_dpswap.json"
if [[ -f $out/c_auto.json ]]; then
  python3 - "$out" "$cap_mib" >"$out/sim.yaml" <<'PY'
import json, sys
out, cap = sys.argv[1], sys.argv[2]
p = json.load(open(f"{out}/c_auto.json"))["plan"]  # packs: [[first, last], ...] (docs/output-schema.md)
print(f"model: {{profile: {out}/profile.json}}")
print(f"machine: {{file: {out}/machine.yaml, gpu_memory: {cap}MiB}}")
print("cost_model: native")
print(f"plan: {{mode: {p['plan_kind']}, gpus: {p['gpus']}, minibatch: {p['minibatch']}, u_fwd: {p['u_fwd']}, "
      f"u_bwd: {p['u_bwd']}, packs_bwd: {json.dumps(p['packs_bwd'])}, packs_fwd: {json.dumps(p['packs_fwd'])}}}")
PY
  step d_sim 30 "$sim" simulate "$out/sim.yaml" --format json && cp "$out/d_sim.out" "$out/d_sim.json"
fi

# (e) calibrate on (b) and (c) dp-swap, predict (c) Harmony. Each run's Program as a harmony-run config: gpt.yaml
# with the measured profile, the run's memory cap and the plan it trained (from its JSON), so calibrate lowers
# exactly the Program the trace recorded (flags like --tf32 change kernels, not the Program).
echo "== (e) calibrate on (b) + (c) dp-swap, predict (c) Harmony"
program_config() {  # program_config RUN_JSON CAP_MIB ("" = gpt.yaml's memory) > CONFIG
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
    program_config "$out/c_dpswap.json" "${cap_mib}MiB" >"$out/e_dpswap.yaml" &&
    step e_calibrate 60 "$sim" calibrate "$out/machine.yaml" \
      --run "$out/e_b.yaml,$out/b.trace.json,$out/b.json" \
      --run "$out/e_dpswap.yaml,$out/c_dpswap.trace.json,$out/c_dpswap.json" \
      --out "$out/machine-calibrated.yaml" --format json && cp "$out/e_calibrate.out" "$out/e_calibrate.json" &&
    calibrated=true
fi
if [[ $calibrated == true && -f $out/c_auto.json && -f $out/c_auto.trace.json ]]; then
  program_config "$out/c_auto.json" "${cap_mib}MiB" >"$out/e_auto.yaml" &&
    step e_predict 60 "$sim" calibrate "$out/machine-calibrated.yaml" \
      --run "$out/e_auto.yaml,$out/c_auto.trace.json,$out/c_auto.json" --check --format json &&
    cp "$out/e_predict.out" "$out/e_predict.json"
fi

echo "== losses of every plan kind, CUDA vs CPU (3 steps, strict fp32; then bf16 when the CUDA device trains it)"
for kind in harmony-pp harmony-dp pp-swap dp-swap zero-infinity l2l lohan; do
  u=()
  [[ $kind == lohan ]] && u=(--set plan.u_fwd=4 --set plan.u_bwd=4)  # lohan: one microbatch per GPU (D/N = 8/2)
  for prec in fp32 bf16; do
    [[ $prec == bf16 && $bf16 != true ]] && continue
    tag=$kind
    prec_args=()
    [[ $prec == bf16 ]] && tag=bf16_$kind && prec_args=(--dtype bf16)
    for dev in cuda cpu; do
      step "loss_${tag}_$dev" 30 "$run" train configs/run/default.yaml --steps 3 --set "plan.mode=$kind" \
        --set plan.gpus=2 "${u[@]}" "${prec_args[@]}" --gpu-memory 4MiB --set "device=$dev" --format json --quiet &&
        cp "$out/loss_${tag}_$dev.out" "$out/loss_${tag}_$dev.json"
    done
  done
done
finish
