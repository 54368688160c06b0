#!/usr/bin/env bash
# Regenerates the compare tables of docs/comparison.md: every plan kind on the bundled profiles, the
# paper-1080ti preset, native cost model, N = 1, 2, 4, 8; plus the "model larger than the GPU" runs.
#   scripts/make-comparison.sh [BUILD_DIR]      (default build/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
sim=${1:-build}/sim/harmony-sim
run() {
  echo '```'
  echo "\$ harmony-sim compare $*"
  "$sim" compare "$@" | tail -n +3 | sed '/^$/d'
  echo '```'
}
for cfg in configs/default.yaml configs/examples/gpt2_medium_search.yaml; do
  for n in 1 2 4 8; do
    run "$cfg" --set cost_model=native --set plan.gpus=$n
  done
done
for mem in 2GiB 1GiB; do
  run configs/default.yaml --set cost_model=native --set plan.gpus=2 --set plan.minibatch=64 --set machine.gpu_memory=$mem
done
run configs/default.yaml --set cost_model=reference --set plan.gpus=2
