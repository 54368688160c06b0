#!/usr/bin/env bash
# clang-tidy (checks in .clang-tidy: bugprone-*, performance-*) over core/, sim/, backend/ and apps/ sources, using
# build/compile_commands.json (configures `build` if needed). Exit 1 on any finding.
#   scripts/tidy.sh                 all core/, sim/, backend/ and apps/ .cpp files
#   scripts/tidy.sh FILE...         only these
#   BUILD_DIR=build-x scripts/tidy.sh
# Slow (minutes): scripts/test.sh runs it only with HARMONY_TIDY=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

clang_tidy=${CLANG_TIDY:-}
if [[ -z $clang_tidy ]]; then
  for c in clang-tidy-14 clang-tidy; do
    if command -v "$c" >/dev/null 2>&1; then clang_tidy=$c; break; fi
  done
fi
[[ -n $clang_tidy ]] || { echo "tidy: clang-tidy not found (apt-get install clang-tidy)" >&2; exit 2; }

if [[ ! -f $build/compile_commands.json ]]; then
  echo "tidy: configuring $build"
  meson setup "$build" >/dev/null
fi
# Generated headers (e.g. core/machine_presets.inc) must exist before clang-tidy parses their users.
mapfile -t generated < <(meson introspect --targets "$build" | python3 -c '
import json, os, sys
build = sys.argv[1]
for t in json.load(sys.stdin):
    if t["type"] == "custom":
        for f in t["filename"]:
            print(os.path.relpath(f, build))' "$build")
if ((${#generated[@]})); then
  ninja -C "$build" "${generated[@]}" >/dev/null
fi

if (($#)); then
  files=("$@")
else
  mapfile -t files < <(python3 - "$build" <<'PY'
import json, os, sys
root = os.getcwd()
seen = set()
for entry in json.load(open(os.path.join(sys.argv[1], "compile_commands.json"))):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    # library and app sources; the unit tests beside them (*_test.cpp) are test code, outside tidy as tests/ is
    if (rel.split(os.sep)[0] in ("core", "sim", "backend", "apps") and rel.endswith(".cpp")
            and not rel.endswith("_test.cpp") and rel not in seen):
        seen.add(rel)
        print(rel)
PY
)
fi
if ((${#files[@]} == 0)); then
  echo "tidy: no core/, sim/, backend/ or apps/ sources in $build/compile_commands.json"
  exit 0
fi

echo "tidy: $clang_tidy on ${#files[@]} files, $jobs jobs"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The compile commands are GCC's: drop clang's complaints about GCC-only flags, and keep compiler
# warnings as warnings (the -Werror build already gates them); only .clang-tidy's checks fail here.
status=0
printf '%s\0' "${files[@]}" |
  xargs -0 -n 1 -P "$jobs" "$clang_tidy" -p "$build" --quiet \
    --extra-arg=-Wno-unknown-warning-option --extra-arg=-Wno-error >"$log" 2>&1 || status=$?
grep -vE '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^Use -system-headers' "$log" || true
if ((status)); then
  echo "tidy: findings (or clang-tidy errors) above"
  exit 1
fi
echo "tidy: ${#files[@]} files clean"
