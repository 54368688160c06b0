#!/usr/bin/env bash
# Runs the bundled sweep (configs/sweeps/gpt_1b_100b.yaml) and executes every notebook in notebooks/ headless
# against it: OUT_DIR/sweep (the sweep), OUT_DIR/report.html (harmony-sim report), OUT_DIR/*.ipynb (executed
# copies), OUT_DIR/figures/*.png. Exit 1 if a cell raises or a committed notebook has outputs. scripts/test.sh
# runs it as the "notebooks" step.
#   scripts/run-notebooks.sh BUILD_DIR [OUT_DIR]        (default OUT_DIR: out/notebooks)
# Knobs: HARMONY_NOTEBOOK_TIMEOUT=300 (seconds per cell), HARMONY_PYTHON=/usr/bin/python3 (the Debian Python
# with matplotlib and Jupyter; not the first python3 on PATH, which may be a pyenv one without them).
set -euo pipefail

if (($# < 1 || $# > 2)); then
  echo "usage: scripts/run-notebooks.sh BUILD_DIR [OUT_DIR]   (e.g. scripts/run-notebooks.sh build out/notebooks)" >&2
  exit 2
fi
# Paths are taken from the caller's directory, then everything runs from the repository root.
build=$(realpath -m -- "$1")
out=$(realpath -m -- "${2:-out/notebooks}")
cd "$(dirname "${BASH_SOURCE[0]}")/.."

sweep_file=configs/sweeps/gpt_1b_100b.yaml
sim=$build/sim/harmony-sim
py=${HARMONY_PYTHON:-/usr/bin/python3}
timeout=${HARMONY_NOTEBOOK_TIMEOUT:-300}

die() { echo "run-notebooks: $*" >&2; exit 1; }
since() { awk -v a="$1" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }'; }  # seconds since $1

[[ -x $sim ]] || die "no $sim: build it first (meson setup $build && ninja -C $build sim/harmony-sim)"
[[ -x $py ]] || die "no $py: sudo apt-get install -y python3 (or set HARMONY_PYTHON to a Python with Jupyter)"

# Each Python module the run needs, with the Debian package that carries it.
missing=()
for pair in matplotlib:python3-matplotlib PIL:python3-pil nbformat:python3-nbformat nbclient:python3-nbclient \
  ipykernel:python3-ipykernel nbconvert:jupyter-nbconvert; do
  "$py" -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  die "$py lacks the Python modules of ${missing[*]}: sudo apt-get install -y --no-install-recommends ${missing[*]}" \
    "(or bash scripts/install-deps.sh)"
fi

# Jupyter writes runtime files and matplotlib its cache under $HOME, which CI may not have writable.
scratch=$(mktemp -d)
report_pid=
trap '[[ -z $report_pid ]] || kill "$report_pid" 2>/dev/null; rm -rf "$scratch"' EXIT
export MPLCONFIGDIR=$scratch/mpl JUPYTER_RUNTIME_DIR=$scratch/jupyter-runtime IPYTHONDIR=$scratch/ipython
export PYDEVD_DISABLE_FILE_VALIDATION=1  # ipykernel's debugger warns about frozen modules otherwise
unset MPLBACKEND                         # the kernel's inline backend renders with Agg: no display needed

# The notebooks ask for the "python3" kernel: it must run a Python that has matplotlib (the Debian kernelspec
# runs /usr/bin/python3; a kernelspec under ~/.local/share/jupyter could point elsewhere).
kernel=$("$py" -c 'from jupyter_client.kernelspec import KernelSpecManager as K
k = K().get_kernel_spec("python3"); print(k.argv[0]); print(k.resource_dir)') ||
  die "no Jupyter kernel named python3: sudo apt-get install -y python3-ipykernel"
kernel_py=${kernel%%$'\n'*}
kernel_dir=${kernel#*$'\n'}
kernel_py=$(command -v -- "$kernel_py") || die "the python3 kernel's interpreter ($kernel_py) is not installed"
"$kernel_py" -c 'import matplotlib, ipykernel' 2>/dev/null ||
  die "the Jupyter kernel python3 ($kernel_dir) runs $kernel_py, which lacks matplotlib or ipykernel:" \
    "remove that kernelspec so that the Debian one (/usr/share/jupyter/kernels/python3) is used"

# Committed notebooks keep their outputs cleared: CI executes them fresh.
clear_hint="clear them before committing: $py -m nbconvert --clear-output --inplace FILE"
"$py" - notebooks/*.ipynb <<'EOF' || die "$clear_hint"
import sys, nbformat
dirty = [f"{path}: cell {i} has outputs" for path in sys.argv[1:]
         for i, c in enumerate(nbformat.read(path, as_version=4).cells)
         if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
print("\n".join(dirty), file=sys.stderr)
sys.exit(1 if dirty else 0)
EOF

# The sweep: reuse OUT_DIR/sweep when it is newer than the binary and the sweep files, else start it afresh; an
# unfinished one resumes (harmony-sim sweep only computes the points missing).
sweep_dir=$out/sweep
if [[ -f $sweep_dir/results.jsonl ]]; then
  for f in "$sim" "$sweep_file" configs/sweeps/gpt_base.yaml; do
    if [[ $f -nt $sweep_dir/results.jsonl ]]; then
      echo "run-notebooks: $f is newer than $sweep_dir: running the sweep again"
      rm -rf "$sweep_dir"
      break
    fi
  done
fi
rm -rf "$out/figures" "$out"/*.ipynb  # never show a previous run's figures as this run's
mkdir -p "$out/figures"
echo "run-notebooks: $sim sweep $sweep_file --out $sweep_dir"
start=$EPOCHREALTIME
"$sim" sweep "$sweep_file" --out "$sweep_dir" || die "the sweep failed (above)"
echo "run-notebooks: sweep took $(since "$start") s"
# The sweep's HTML page (docs/report.md) next to the notebooks' output: CI exercises the report on a full sweep.
# It runs on one core (~45 s on the 2-core CI machine) while the notebooks execute on the other (~20 s); its output
# is printed after them.
report_start=$EPOCHREALTIME
"$sim" report "$sweep_dir" --out "$out/report.html" >"$scratch/report.log" 2>&1 &
report_pid=$!

failed=()
for nb in notebooks/*.ipynb; do
  echo "run-notebooks: executing $nb (per-cell timeout ${timeout}s)"
  start=$EPOCHREALTIME
  if HARMONY_SWEEP_DIR=$sweep_dir HARMONY_FIGURES_DIR=$out/figures "$py" -m nbconvert --to notebook --execute \
    --ExecutePreprocessor.timeout="$timeout" --ExecutePreprocessor.kernel_name=python3 \
    --output-dir "$out" "$nb"; then
    echo "run-notebooks: $nb: ok in $(since "$start") s -> $out/$(basename "$nb")"
  else
    echo "---- run-notebooks: $nb FAILED (the cell and its traceback are above)"
    failed+=("$nb")
  fi
done
report_rc=0
wait "$report_pid" || report_rc=$?
report_pid=
cat "$scratch/report.log"
if ((report_rc == 0)); then
  echo "run-notebooks: report took $(since "$report_start") s (beside the notebooks)"
else
  echo "---- run-notebooks: harmony-sim report FAILED (exit $report_rc, above)"
  failed+=("harmony-sim report")
fi
shopt -s nullglob
figures=("$out"/figures/*.png)
echo "run-notebooks: figures in $out/figures: ${figures[*]##*/}"
((${#failed[@]} == 0)) || die "failed: ${failed[*]}"
