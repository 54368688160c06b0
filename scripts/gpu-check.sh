#!/usr/bin/env bash
# The CUDA device's check on a machine with an NVIDIA GPU (issue "harmony-run v2"; < 8 min on one H200):
#   1. builds (release, -Dcuda=enabled, -Dgpu_arch=90 plus the local GPU's) the CUDA tests, benches, harmony-run
#      and harmony-sim in $BUILD_DIR (default build-gpu/);
#   2. runs the CUDA tests (backend_cuda_device, backend_adamw_parallel);
#   3. measures (a) pinned H2D/D2H bandwidth and cuBLAS SGEMM / TF32 rates (bench_cuda) and the host AdamW
#      (bench_adamw); (b) a GPT that fits, trained in memory on the GPU: throughput and MFU; (c) the same model
#      with the GPU capped to a quarter of (b)'s footprint, under the searched Harmony plan (--plan auto) and
#      under dp-swap; (d) harmony-sim's prediction for (c) from a profile `harmony-run profile` takes on this GPU.
# Prints one table at the end; logs, JSON results, the profile and the traces go to OUT_DIR.
#
# usage: scripts/gpu-check.sh OUT_DIR
# knobs: GPT2='{vocab_size: 50257, max_seq_len: 1024, n_layer: 12, n_head: 12, n_embd: 768}' SEQ_LEN=512 BATCH=8
#        STEPS=6 JOBS=$(nproc) BUILD_DIR=build-gpu PEAK_TFLOPS=<fp32 peak for MFU; default by GPU name or SGEMM>
#        SKIP_BUILD=1 (measure again with the binaries already in BUILD_DIR)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD

if (($# != 1)); then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu-check: cannot create $1" >&2; exit 2; }
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
gpt2=${GPT2:-'{vocab_size: 50257, max_seq_len: 1024, n_layer: 12, n_head: 12, n_embd: 768}'}
seq_len=${SEQ_LEN:-512}
batch=${BATCH:-8}
steps=${STEPS:-6}
start=$SECONDS
rows=()  # "check<TAB>result" lines of the final table
row() { rows+=("$(printf '%s\t%s' "$1" "$2")"); printf '  %-44s %s\n' "$1" "$2"; }
section() { printf '\n== %s (%ds)\n' "$*" $((SECONDS - start)); }

for tool in nvidia-smi nvcc meson ninja python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "gpu-check: $tool not found" >&2; exit 2; }
done
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
[[ -n $gpu_name && -n $cc ]] || { echo "gpu-check: nvidia-smi lists no GPU" >&2; exit 2; }
archs=90
[[ $cc != 90 ]] && archs="90,$cc"
echo "gpu-check: $gpu_name (sm_$cc), building for sm_{$archs}; results in $out"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1

# --- 1. build ---------------------------------------------------------------------------------------------------
section "build ($build, -Dgpu_arch=$archs, $jobs jobs)"
if [[ ${SKIP_BUILD:-0} == 1 ]]; then
  row "build" "skipped (SKIP_BUILD=1): $build as it is"
else
targets=(tests/test_backend_cuda_device tests/test_backend_adamw_parallel bench/bench_cuda bench/bench_adamw
  apps/harmony-run sim/harmony-sim)
setup=(-Dbuildtype=release -Dcuda=enabled "-Dgpu_arch=$archs" -Dfuzz=disabled)
configure() {
  if [[ -f $build/meson-private/coredata.dat ]]; then
    meson setup --reconfigure "$build" "${setup[@]}"
  else
    meson setup "$build" "${setup[@]}"
  fi
}
if ! { configure && ninja -C "$build" -j "$jobs" "${targets[@]}"; } >"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log"
  echo "gpu-check: the build failed (log: $out/build.log)" >&2
  exit 1
fi
row "build (sm_$archs)" "ok, $((SECONDS - start)) s"
fi

# --- 2. tests ---------------------------------------------------------------------------------------------------
section "CUDA tests"
for t in backend_cuda_device backend_adamw_parallel; do
  t0=$SECONDS
  HARMONY_SOURCE_DIR=$root timeout 300 "$build/tests/test_$t" >"$out/test_$t.log" 2>&1
  rc=$?
  case $rc in
    0) row "test $t" "passed ($((SECONDS - t0)) s)" ;;
    77) row "test $t" "SKIPPED: no usable GPU?" ;;
    *) row "test $t" "FAILED (rc $rc, log test_$t.log)"; grep -E "ERROR|CHECK|REQUIRE" "$out/test_$t.log" | head -n 20 ;;
  esac
done

# --- 3a. microbenchmarks -----------------------------------------------------------------------------------------
section "(a) copies, GEMMs, host AdamW"
timeout 120 "$build/bench/bench_cuda" --json >"$out/bench_cuda.json" 2>"$out/bench_cuda.log"
timeout 120 "$build/bench/bench_cuda" >>"$out/bench_cuda.log" 2>&1
timeout 180 "$build/bench/bench_adamw" --params 33554432 --repeats 3 >"$out/bench_adamw.txt" 2>&1
python3 - "$out" <<'PY' >"$out/a.txt"
import json, sys
out = sys.argv[1]
try:
    b = json.load(open(f"{out}/bench_cuda.json"))
    print(f"H2D / D2H pinned\t{b['h2d_pinned_GBps']:.1f} / {b['d2h_pinned_GBps']:.1f} GB/s "
          f"(pageable {b['h2d_pageable_GBps']:.1f} / {b['d2h_pageable_GBps']:.1f})")
    print(f"cuBLAS SGEMM fp32 / TF32 (n={b['gemm_n']})\t{b['sgemm_TFLOPs']:.1f} / {b['tf32_TFLOPs']:.1f} TFLOP/s")
except Exception as e:
    print(f"bench_cuda\tFAILED ({e}; see bench_cuda.log)")
best = None
for line in open(f"{out}/bench_adamw.txt"):
    f = line.split()
    if f and f[0] == "ParallelAdamW":
        if best is None or float(f[4]) > best[1]:
            best = (int(f[1]), float(f[4]))
print(f"host AdamW, best of 1..nproc threads\t{best[1]:.1f} GB/s of parameters ({best[0]} threads)" if best
      else "host AdamW\tFAILED (see bench_adamw.txt)")
PY
while IFS=$'\t' read -r k v; do row "$k" "$v"; done <"$out/a.txt"

# --- 3b-d. training on the GPU ------------------------------------------------------------------------------------
run="$build/apps/harmony-run"
sim="$build/sim/harmony-sim"
h2d=$(python3 -c "import json; print(json.load(open('$out/bench_cuda.json'))['h2d_pinned_GBps'])" 2>/dev/null || echo 25)
# The machine harmony-sim and --plan auto see: this GPU alone, its measured pinned host link.
# In memory: the GPU's free memory less 4 GiB for the context, cuBLAS and the streams' workspaces.
free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -n 1 | tr -d ' ')
big="$((free_mib - 4096))MiB"
cat >"$out/machine.yaml" <<EOF
# Written by scripts/gpu-check.sh: one $gpu_name, links from bench_cuda (pinned H2D).
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
layers=$(python3 -c "import yaml,sys; print(yaml.safe_load(sys.argv[1])['n_layer'] + 2)" "$gpt2" 2>/dev/null ||
  python3 -c "import re,sys; print(int(re.search(r'n_layer:\s*(\d+)', sys.argv[1]).group(1)) + 2)" "$gpt2")
cat >"$out/gpt.yaml" <<EOF
# Written by scripts/gpu-check.sh: the GPT of checks (b)-(d), trained on the CUDA device.
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

section "(b) in memory"
timeout 300 "$run" train "$out/gpt.yaml" --format json --quiet --trace "$out/b_trace.json" >"$out/b.json" 2>"$out/b.log"
rc=$?
if ((rc != 0)); then
  if grep -q "not built into this harmony-run\|device 'cuda'" "$out/b.log"; then
    reason="harmony-run has no CUDA device yet (apps/harmony_run.cpp must wire cuda::make_cuda_device)"
  else
    reason="harmony-run failed (rc $rc): $(grep -m1 -iE 'error|what' "$out/b.log" || tail -n 1 "$out/b.log")"
  fi
  row "(b)-(d) training on the GPU" "SKIPPED: $reason"
else
  python3 - "$out" "$gpu_name" "${PEAK_TFLOPS:-}" "$gpt2" "$seq_len" <<'PY' >"$out/b.txt"
import json, re, sys
out, gpu, peak_env, gpt2, T = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
b = json.load(open(f"{out}/b.json"))
s = b["summary"]
steps = [x["step_time_s"] for x in b["steps"]][1:] or [x["step_time_s"] for x in b["steps"]]  # the first step warms up
step_s = sum(steps) / len(steps)
g = {k: int(v) for k, v in re.findall(r"(vocab_size|max_seq_len|n_layer|n_head|n_embd):\s*(\d+)", gpt2)}
B = b["plan"]["minibatch"]
N = s["num_parameters"]
# Model FLOPs per step (PaLM's count): 6 N per token, plus 12 L C T per token for attention scores and values.
flops = (6 * N + 12 * g["n_layer"] * g["n_embd"] * T) * B * T
peak = float(peak_env) if peak_env else (67.0 if ("H100" in gpu or "H200" in gpu) else None)
if peak is None:
    peak = json.load(open(f"{out}/bench_cuda.json"))["sgemm_TFLOPs"]
mfu = flops / step_s / (peak * 1e12)
json.dump({"step_s": step_s, "samples_per_s": B / step_s, "mfu": mfu, "peak_tflops": peak,
           "footprint_bytes": s["peak_memory_bytes"], "model_flops_per_step": flops}, open(f"{out}/b_summary.json", "w"))
print(f"(b) in memory: {N / 1e6:.0f}M params, B={B} T={T}\t{B / step_s:.2f} samples/s, {step_s:.3f} s/step, "
      f"MFU {100 * mfu:.1f}% of {peak:.0f} TFLOP/s fp32; footprint {s['peak_memory_bytes'] / 2**30:.2f} GiB")
PY
  while IFS=$'\t' read -r k v; do row "$k" "$v"; done <"$out/b.txt"
  footprint=$(python3 -c "import json; print(json.load(open('$out/b_summary.json'))['footprint_bytes'])")
  cap_mib=$((footprint / 4 / 1048576))

  section "(d) profile on the GPU"
  timeout 240 "$run" profile "$out/gpt.yaml" --out "$out/profile.json" --repeats 5 >"$out/profile.log" 2>&1 ||
    row "(d) harmony-run profile" "FAILED (see profile.log)"

  section "(c) capped to a quarter: ${cap_mib} MiB"
  timeout 300 "$run" train "$out/gpt.yaml" --plan auto --gpu-memory "${cap_mib}MiB" --set "model.profile=$out/profile.json" \
    --format json --quiet --trace "$out/c_auto_trace.json" >"$out/c_auto.json" 2>"$out/c_auto.log"
  rc_auto=$?
  timeout 300 "$run" train "$out/gpt.yaml" --plan auto --gpu-memory "${cap_mib}MiB" --set "model.profile=$out/profile.json" \
    --set plan.mode=dp-swap --format json --quiet --trace "$out/c_dpswap_trace.json" >"$out/c_dpswap.json" \
    2>"$out/c_dpswap.log"
  rc_swap=$?
  python3 - "$out" "$rc_auto" "$rc_swap" "$cap_mib" <<'PY' >"$out/c.txt"
import json, sys
out, rc_auto, rc_swap, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ref = json.load(open(f"{out}/b_summary.json"))
def measured(name):
    b = json.load(open(f"{out}/{name}.json"))
    t = [x["step_time_s"] for x in b["steps"]][1:] or [x["step_time_s"] for x in b["steps"]]
    return b, sum(t) / len(t)
def first_error(name):
    for line in open(f"{out}/{name}.log"):
        if "error" in line.lower():
            return line.strip()[:160]
    return "see " + name + ".log"
if rc_auto == 0:
    b, step = measured("c_auto")
    print(f"(c) --plan auto at {cap} MiB: {b['plan']['title']}\t{b['plan']['minibatch'] / step:.2f} samples/s, "
          f"{step:.3f} s/step ({step / ref['step_s']:.2f}x in-memory); peak {b['summary']['peak_memory_bytes'] / 2**20:.0f} MiB")
    json.dump({"step_s": step, "plan": b["plan"]}, open(f"{out}/c_auto_summary.json", "w"))
else:
    print(f"(c) --plan auto at {cap} MiB\tFAILED (rc {rc_auto}): {first_error('c_auto')}")
if rc_swap == 0:
    b, step = measured("c_dpswap")
    print(f"(c) dp-swap at {cap} MiB: {b['plan']['title']}\t{b['plan']['minibatch'] / step:.2f} samples/s, "
          f"{step:.3f} s/step ({step / ref['step_s']:.2f}x in-memory)")
else:
    print(f"(c) dp-swap at {cap} MiB\tSKIPPED: harmony-run could not run it (rc {rc_swap}): {first_error('c_dpswap')}")
PY
  while IFS=$'\t' read -r k v; do row "$k" "$v"; done <"$out/c.txt"

  section "(d) harmony-sim's prediction for (c)"
  if [[ -f $out/c_auto_summary.json && -f $out/profile.json ]]; then
    python3 - "$out" "$cap_mib" >"$out/sim.yaml" <<'PY'
import json, sys
out, cap = sys.argv[1], sys.argv[2]
p = json.load(open(f"{out}/c_auto_summary.json"))["plan"]  # packs: [[first, last], ...] (docs/output-schema.md)
print(f"model: {{profile: {out}/profile.json}}")
print(f"machine: {{file: {out}/machine.yaml, gpu_memory: {cap}MiB}}")
print("cost_model: native")
print(f"plan: {{mode: {p['plan_kind']}, gpus: {p['gpus']}, minibatch: {p['minibatch']}, u_fwd: {p['u_fwd']}, "
      f"u_bwd: {p['u_bwd']}, packs_bwd: {json.dumps(p['packs_bwd'])}, packs_fwd: {json.dumps(p['packs_fwd'])}}}")
PY
    if timeout 120 "$sim" simulate "$out/sim.yaml" --format json --trace "$out/d_sim_trace.json" >"$out/d_sim.json" \
      2>"$out/d_sim.log"; then
      python3 - "$out" <<'PY' >"$out/d.txt"
import json, sys
out = sys.argv[1]
pred = json.load(open(f"{out}/d_sim.json"))["result"]["iteration_time_s"]
meas = json.load(open(f"{out}/c_auto_summary.json"))["step_s"]
print(f"(d) harmony-sim (native) vs measured, (c) auto\t{pred:.3f} s predicted vs {meas:.3f} s measured: "
      f"error {100 * (pred - meas) / meas:+.0f}%")
PY
      while IFS=$'\t' read -r k v; do row "$k" "$v"; done <"$out/d.txt"
    else
      row "(d) harmony-sim simulate" "FAILED: $(head -n 1 "$out/d_sim.log")"
    fi
  else
    row "(d) harmony-sim's prediction" "SKIPPED: needs (c) --plan auto and the profile"
  fi
fi

# --- table ----------------------------------------------------------------------------------------------------------
printf '\ngpu-check on %s (sm_%s), %d s; logs, JSON and traces in %s\n\n' "$gpu_name" "$cc" $((SECONDS - start)) "$out"
printf '| check | result |\n|---|---|\n'
for r in "${rows[@]}"; do printf '| %s | %s |\n' "${r%%$'\t'*}" "${r#*$'\t'}"; done | tee "$out/table.md"
grep -q "FAILED" "$out/table.md" && exit 1
exit 0
