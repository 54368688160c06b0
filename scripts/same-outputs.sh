#!/usr/bin/env bash
# Same outputs across a refactor: runs one fixed set of harmony-sim commands with a reference binary (built once from
# a git revision, main by default) and with this tree's, and compares every output byte for byte: stdout (tables and
# --format json), Chrome traces, the bundled sweep's results.csv / results.jsonl, its report (HTML and JSON) and
# calibrate's fitted machine and JSON. The process's own clock (wall_time_s, "in 12 ms"), the output folder's path
# and lock records are set aside.
#
#   scripts/same-outputs.sh                     reference = main, this tree's build/ (built first)
#   scripts/same-outputs.sh --ref REV           reference = REV (a commit, branch or tag)
#   scripts/same-outputs.sh --ref-bin PATH      reference = this harmony-sim binary
#   BUILD_DIR=build-x scripts/same-outputs.sh   this tree's build folder
#   SAME_OUTPUTS_DIR=DIR ...                    where references and outputs go (default /tmp/harmony-same-outputs)
#
# A reference build is kept per commit under SAME_OUTPUTS_DIR/ref-<commit>/ (a detached git worktree and its release
# build), so later runs only run. calibrate's inputs (a profile, two trained runs with traces: test_calibrate.py's
# loop) are recorded once per reference with that reference's harmony-run, and both binaries read the same files.
# Exit 0: every output the same; 1: the differing files listed; 2: bad usage or a command failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
build=${BUILD_DIR:-build}
work=${SAME_OUTPUTS_DIR:-/tmp/harmony-same-outputs}
ref=main
ref_bin=
while (($#)); do
  case $1 in
    --ref) ref=$2; shift 2 ;;
    --ref-bin) ref_bin=$(realpath "$2"); shift 2 ;;
    -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "same-outputs: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$work"

# harmony-sim / harmony-run under a build folder, wherever the tree's meson files put them
find_tool() { find "$1" -name "$2" -type f -perm -u+x -not -path '*/meson-private/*' | head -1; }

# ---- the reference ----
if [[ -z $ref_bin ]]; then
  sha=$(git rev-parse --verify "$ref^{commit}") || { echo "same-outputs: no revision '$ref'" >&2; exit 2; }
  ref_dir=$work/ref-$sha
  if [[ ! -d $ref_dir/src ]]; then
    git worktree add --detach "$ref_dir/src" "$sha" >/dev/null
  fi
  if [[ ! -f $ref_dir/build/build.ninja ]]; then
    meson setup "$ref_dir/build" "$ref_dir/src" -Dbuildtype=release -Dfuzz=disabled -Dcuda=disabled >/dev/null
  fi
  echo "same-outputs: building the reference ($ref = ${sha:0:10}) in $ref_dir/build"
  mapfile -t tools < <(ninja -C "$ref_dir/build" -t targets all | sed -n -E 's/^([^:]*harmony-(sim|run)): .*/\1/p')
  ninja -C "$ref_dir/build" "${tools[@]}" >/dev/null
  ref_bin=$(find_tool "$ref_dir/build" harmony-sim)
  ref_run=$(find_tool "$ref_dir/build" harmony-run)
else
  ref_dir=$work/ref-bin
  mkdir -p "$ref_dir"
  ref_run=
fi
echo "same-outputs: building this tree in $build"
[[ -f $build/build.ninja ]] || meson setup "$build" -Dbuildtype=release >/dev/null
ninja -C "$build" >/dev/null
new_bin=$(find_tool "$build" harmony-sim)
[[ -z $ref_run ]] && ref_run=$(find_tool "$build" harmony-run)
echo "same-outputs: reference $ref_bin"
echo "same-outputs: this tree $new_bin"

# ---- calibrate's recorded inputs (once per reference) ----
cal=$ref_dir/calibrate-data
if [[ ! -f $cal/done ]]; then
  rm -rf "$cal" && mkdir -p "$cal"
  "$ref_run" profile configs/run/default.yaml --out "$cal/profile.json" --gpu-memory 64MiB --repeats 1 --ubatch 2 \
    >/dev/null 2>"$cal/profile.err"
  for run in "a|mode: harmony-dp, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2, pack_size: 5|8MiB" \
    "b|mode: pp-swap, gpus: 2, minibatch: 8, u_fwd: 2, u_bwd: 2|16MiB"; do
    IFS='|' read -r name plan mem <<<"$run"
    cat >"$cal/$name.yaml" <<EOF
model:
  gpt2: {vocab_size: 256, max_seq_len: 64, n_layer: 8, n_head: 4, n_embd: 64}
  seq_len: 32
  init_seed: 1
  profile: $cal/profile.json
machine: {file: $root/configs/machines/cpu-4x.yaml, gpu_memory: $mem}
device: cpu
cost_model: native
plan: {$plan}
train:
  steps: 2
  lr: 3e-3
  data: {synthetic_tokens: 4096, seed: 1}
EOF
    "$ref_run" train "$cal/$name.yaml" --steps 2 --format json --executor concurrent --trace "$cal/$name.trace.json" \
      >"$cal/$name.json" 2>"$cal/$name.err"
  done
  touch "$cal/done"
fi
runs_a=$cal/a.yaml,$cal/a.trace.json,$cal/a.json
runs_b=$cal/b.yaml,$cal/b.trace.json,$cal/b.json

# ---- the commands: NAME|ARGS (OUT/ in ARGS is the command's output folder) ----
native='--set cost_model=native'
commands=(
  "search|search configs/default.yaml"
  "search-json|search configs/default.yaml --format json --trace OUT/trace.json"
  "search-native|search configs/default.yaml $native --format json --trace OUT/trace.json"
  "search-dp|search configs/examples/bert_large_search.yaml --set plan.mode=harmony-dp --format json"
  "search-bert|search configs/examples/bert_large_search.yaml --format json --trace OUT/trace.json"
  "search-gpt2|search configs/examples/gpt2_medium_search.yaml --format json --trace OUT/trace.json"
  "search-gpt2-native|search configs/examples/gpt2_medium_search.yaml $native --format json"
  "simulate|simulate configs/examples/bert_large_simulate.yaml"
  "simulate-json|simulate configs/examples/bert_large_simulate.yaml --format json --trace OUT/trace.json"
  "simulate-native|simulate configs/examples/bert_large_simulate.yaml $native --format json --trace OUT/trace.json"
  "simulate-default|simulate configs/default.yaml --set plan.u_fwd=8 --set plan.u_bwd=4 --set plan.pack_size=7 --format json --trace OUT/trace.json"
  "simulate-default-native|simulate configs/default.yaml --set plan.u_fwd=8 --set plan.u_bwd=4 --set plan.pack_size=7 $native --format json --trace OUT/trace.json"
  "compare|compare configs/default.yaml --quiet"
  "compare-json|compare configs/default.yaml --format json --trace OUT/trace.json --quiet"
  "compare-native|compare configs/default.yaml $native --format json --trace OUT/trace.json --quiet"
  "compare-qwen2|compare configs/models/qwen2-7b/compare.yaml --format json --quiet"
  "presets|presets --format json"
  "sweep|sweep configs/sweeps/gpt_1b_100b.yaml --out OUT/sweep --quiet --format json"
  "report|report OUT/../sweep/sweep --out OUT/report.html --format json"
  "report-config|report configs/default.yaml --out OUT/report.html --format json"
  "calibrate|calibrate configs/machines/cpu-4x.yaml --run $runs_a --out OUT/fitted.yaml --format json"
  "calibrate-check|calibrate configs/machines/cpu-4x.yaml --run $runs_a --run $runs_b --check --format json"
)

# run_all BIN DIR: every command, its stdout, stderr and exit code under DIR/NAME/
run_all() {
  local bin=$1 dir=$2 entry name args
  rm -rf "$dir" && mkdir -p "$dir"
  for entry in "${commands[@]}"; do
    name=${entry%%|*}
    args=${entry#*|}
    # One search thread: with several, the counters of declined and stopped candidates (num_pruned, ...) depend on
    # which runs finish first (the ranking does not); one thread makes every output a function of the inputs.
    [[ $args == search* || $args == compare* ]] && args="$args --set search.threads=1"
    mkdir -p "$dir/$name"
    args=${args//OUT\/..\//$dir/}
    args=${args//OUT\//$dir/$name/}
    # shellcheck disable=SC2086  # the arguments are words
    local rc=0
    (cd "$root" && "$bin" $args >"$dir/$name/stdout" 2>"$dir/$name/stderr") || rc=$?
    echo "$rc" >"$dir/$name/exit"
  done
  # what may differ between two runs and is set aside: the process's own clock (JSON's wall_time_s, the tables'
  # "in 12.3 ms" / "; 597.5 ms" / "M ops/s"), the output folder's own path, and a lock file's holder record
  find "$dir" -name '*.lock' -type f -delete
  find "$dir" -type f -print0 | xargs -0 sed -i -E -e 's/("wall_time_s": )[-0-9.e+]+/\10/g' \
    -e 's/ in [0-9.]+ (ms|s|us)\b/ in T/g' -e 's/; [0-9.]+ (ms|s)$/; T/' -e 's/[0-9.]+ M ops\/s/R M ops\/s/g' \
    -e "s#$dir/#OUT/#g"
}

echo "same-outputs: running ${#commands[@]} commands with the reference"
run_all "$ref_bin" "$work/out-ref"
echo "same-outputs: running ${#commands[@]} commands with this tree"
run_all "$(realpath "$new_bin")" "$work/out-new"

failed=0
for entry in "${commands[@]}"; do
  name=${entry%%|*}
  if [[ $(cat "$work/out-ref/$name/exit") != 0 ]]; then
    echo "same-outputs: the reference's '$name' exited $(cat "$work/out-ref/$name/exit"): $(head -c 300 "$work/out-ref/$name/stderr")" >&2
    failed=2
  fi
done
differ=0
files=0
while IFS= read -r -d '' f; do
  rel=${f#"$work/out-ref/"}
  files=$((files + 1))
  [[ $rel == */stderr ]] && continue  # progress and timings; a message's text is checked by the CLI tests
  if ! cmp -s "$f" "$work/out-new/$rel"; then
    echo "DIFFERS: $rel"
    differ=$((differ + 1))
  fi
done < <(find "$work/out-ref" -type f -print0 | sort -z)
while IFS= read -r -d '' f; do
  rel=${f#"$work/out-new/"}
  [[ -e $work/out-ref/$rel ]] || { echo "ONLY IN THIS TREE: $rel"; differ=$((differ + 1)); }
done < <(find "$work/out-new" -type f -print0 | sort -z)
((failed)) && exit 2
if ((differ)); then
  echo "same-outputs: $differ file(s) differ (outputs under $work/out-ref and $work/out-new)"
  exit 1
fi
echo "same-outputs: ${#commands[@]} commands, $files files, all the same"
