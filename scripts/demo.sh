#!/usr/bin/env bash
# The main job: install deps, build, then search the default configuration and write its
# Chrome trace (open traces/default_search_best.json in https://ui.perfetto.dev or chrome://tracing).
#   scripts/demo.sh [EXTRA harmony-sim ARGS...]     e.g. scripts/demo.sh --set plan.gpus=4
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HARMONY_DEPS_MINIMAL=1 bash scripts/install-deps.sh
if [[ -f build/meson-private/coredata.dat ]]; then
  meson setup --reconfigure build
else
  meson setup build
fi
ninja -C build
mkdir -p traces
set -x
build/sim/harmony-sim search configs/default.yaml --trace traces/default_search_best.json "$@"
