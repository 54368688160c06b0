#!/usr/bin/env bash
# Same training across a refactor of the executor or the lowering: runs harmony-run's bundled default for 3 steps with
# every plan kind, fp32 and bf16, on 1 and 2 CPU devices (Harmony-PP also on 4), and variants (activations keep,
# on-demand swap, the serial executor, host sums, another Harmony schedule), with a reference binary and this tree's,
# and compares per case the per-step losses (as the JSON prints them) and the sha256 of the saved weights. (A reference
# binary from before fsdp trained exits 2 on the fsdp cases, one from before session 17 on zero2, zero3 and
# zero3-opt-offload, one from before session 18 on host-stream: they are listed as differing.)
#
#   scripts/same-training.sh REF_RUN [NEW_RUN]   NEW_RUN: this tree's build/apps/harmony-run by default
#   SAME_TRAINING_DIR=DIR ...                     where the outputs go (default /tmp/harmony-same-training)
#
# Exit 0: every case the same (and exited 0 with both); 1: the differing cases listed; 2: bad usage.
set -euo pipefail
[[ $# -ge 1 && $1 != -h && $1 != --help ]] || { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
ref=$(realpath "$1")  # the binaries as named from the caller's folder
[[ $# -ge 2 ]] && new=$(realpath "$2")
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ $# -ge 2 ]] || new=$(realpath build/apps/harmony-run)
work=${SAME_TRAINING_DIR:-/tmp/harmony-same-training}
cfg=$PWD/configs/run/default.yaml
mkdir -p "$work"

cases=()
for k in harmony-pp harmony-dp dp-swap pp-swap zero-infinity zero3-opt-offload zero-offload l2l lohan fsdp zero3 zero2 \
  resident; do
  for g in 1 2; do for dt in fp32 bf16; do cases+=("$k|$g|$dt|"); done; done
done
cases+=("harmony-pp|4|fp32|" "harmony-pp|4|bf16|"
  "dp-swap|2|fp32|--set plan.activations=keep" "pp-swap|2|bf16|--set plan.activations=keep"
  "zero-infinity|2|fp32|--set plan.activations=keep" "l2l|2|fp32|--set plan.activations=keep"
  "zero-offload|2|bf16|--set plan.activations=keep" "lohan|2|fp32|--set plan.activations=keep"
  "resident|2|fp32|--set plan.activations=keep" "fsdp|2|bf16|--set plan.activations=keep"
  "dp-swap|2|fp32|--set plan.swap=on-demand" "pp-swap|2|fp32|--set plan.swap=on-demand"
  "harmony-pp|2|fp32|--executor serial" "zero-infinity|2|bf16|--executor serial"
  "harmony-dp|2|fp32|--host-sums" "zero-infinity|2|fp32|--host-sums" "fsdp|2|fp32|--host-sums"
  "zero2|2|bf16|--set plan.activations=keep" "zero2|2|fp32|--host-sums"
  "zero3-opt-offload|2|bf16|--set plan.activations=keep" "zero3-opt-offload|2|fp32|--host-sums"
  "harmony-pp|2|fp32|--set plan.u_fwd=4 --set plan.u_bwd=1 --set plan.pack_size=3"
  "host-stream|1|fp32|" "host-stream|1|bf16|" "host-stream|1|fp32|--set plan.u_fwd=8 --set plan.u_bwd=8"
  "host-stream|1|fp32|--set plan.activations=keep" "host-stream|1|bf16|--executor serial")

# one_case BIN OUT CASE: prints "NAME rc=0 losses=[...] weights=SHA" (or the exit code and the error's last line)
one_case() {
  local bin=$1 out=$2 k g dt extra
  IFS='|' read -r k g dt extra <<<"$3"
  local mem=4MiB u=()
  [[ $k == resident || $k == fsdp || $k == zero3 || $k == zero2 ]] && mem=16MiB
  [[ $k == harmony-pp && $g == 4 ]] && mem=1MiB
  # host-stream under keep: its layout estimate keeps more than 4 MiB holds on the tiny model (docs/baselines.md)
  [[ $k == host-stream && $extra == *keep* ]] && mem=8MiB
  [[ $k == lohan ]] && u=(--set "plan.u_fwd=$((8 / g))" --set "plan.u_bwd=$((8 / g))")  # lohan: u = D/N
  local name
  name="$k-g$g-$dt$(printf '%s' "$extra" | tr -c 'a-z0-9' '_')"
  local rc=0
  # shellcheck disable=SC2086  # extra holds several words
  "$bin" train "$cfg" --steps 3 --quiet --format json --set "plan.mode=$k" --set "plan.gpus=$g" --dtype "$dt" \
    --gpu-memory "$mem" "${u[@]}" $extra --save-weights "$out/w.safetensors" >"$out/out.json" 2>"$out/err" || rc=$?
  if [[ $rc == 0 ]]; then
    echo "$name rc=0 losses=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["losses"])' \
      "$out/out.json") weights=$(sha256sum <"$out/w.safetensors" | cut -c1-16)"
  else
    echo "$name rc=$rc $(tail -1 "$out/err" | cut -c1-200)"
  fi
}

for side in ref new; do
  mkdir -p "$work/$side"
  bin=$ref
  [[ $side == new ]] && bin=$new
  echo "same-training: ${#cases[@]} cases with $bin"
  for c in "${cases[@]}"; do one_case "$bin" "$work/$side" "$c"; done >"$work/$side.txt"
done
if grep -qv ' rc=0 ' "$work/ref.txt" "$work/new.txt"; then
  echo "same-training: a case failed:" >&2
  grep -hv ' rc=0 ' "$work/ref.txt" "$work/new.txt" >&2
  exit 1
fi
if ! diff "$work/ref.txt" "$work/new.txt"; then
  echo "same-training: the cases above differ ($work/ref.txt, $work/new.txt)"
  exit 1
fi
echo "same-training: ${#cases[@]} cases, losses and weights all the same"
