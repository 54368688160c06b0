#!/usr/bin/env bash
# Installs harmony's build dependencies on Debian 12, only if one is missing (checked with dpkg -s),
# so a second run is a no-op that needs no network. Runs as root (CI) or through sudo.
#   scripts/install-deps.sh           build deps + the clang tools the checks and fuzzers use + Jupyter and
#                                     matplotlib for the notebooks (scripts/run-notebooks.sh) + headless chromium
#                                     + Node.js and GPT-2's BPE (js-tiktoken, `npm ci` in scripts/tokenizer, only
#                                     when the locked version is not there) for scripts/tokenizer/tokenize.mjs
#   HARMONY_DEPS_MINIMAL=1 ...        build deps only (enough for scripts/demo.sh)
set -euo pipefail

packages=(
  meson ninja-build pkg-config python3
  libfmt-dev libyaml-cpp-dev doctest-dev nlohmann-json3-dev libcli11-dev
  python3-jsonschema  # tests/cli/test_schema.py validates every JSON output against schemas/
  libsimdjson-dev  # the profile loader's fast JSON path (core/model/profile.cpp): parsing speed
  libmimalloc-dev  # harmony-sim's malloc (meson.build, -Dallocator): a search allocates per candidate Program
)
# Used by check-format.sh, tidy.sh and the fuzzers (libclang-rt-14-dev carries libFuzzer).
# ccache: Meson compiles through it when it is on PATH, so a rebuild of unchanged sources (a fresh clone, the
# next CI run on the same machine) is a cache hit; scripts/test.sh sets CCACHE_NOHASHDIR for the -g trees.
tools=(git clang clang-format clang-tidy libclang-rt-14-dev ccache)
# tests/cli/test_torch_side_by_side.py: scripts/torch_side_by_side.py (PyTorch beside harmony-run, issue 34) against
# harmony-run's CPU device; patchelf: scripts/make-gpu-bundle.sh sets the bundle's RUNPATH (tests/cli/test_gpu_bundle.py).
tools+=(python3-torch patchelf)
# scripts/run-notebooks.sh executes notebooks/ headless with the Debian Python (/usr/bin/python3) and its
# "python3" kernel; chromium: headless browser for the tests that render pages.
notebooks=(python3-matplotlib python3-nbformat python3-nbclient python3-ipykernel jupyter-nbconvert)
browser=(chromium)
# scripts/tokenizer/tokenize.mjs: text -> llm.c token file with GPT-2's BPE (js-tiktoken, from the npm registry).
# A Node.js already on PATH (e.g. NodeSource's nodejs, which bundles npm and conflicts with Debian's npm) is used
# as it is; Debian's packages only fill what is missing.
node=()
command -v node >/dev/null 2>&1 || node+=(nodejs)
command -v npm >/dev/null 2>&1 || node+=(npm)
[[ ${HARMONY_DEPS_MINIMAL:-0} == 1 ]] || packages+=("${tools[@]}" "${notebooks[@]}" "${browser[@]}" ${node[@]+"${node[@]}"})

# js-tiktoken as pinned by scripts/tokenizer/package-lock.json; `npm ci` only when that version is not installed.
install_tokenizer() {
  [[ ${HARMONY_DEPS_MINIMAL:-0} == 1 ]] && return 0
  local dir want have
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tokenizer"
  want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["packages"]["node_modules/js-tiktoken"]["version"])' \
    "$dir/package-lock.json")
  have=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' \
    "$dir/node_modules/js-tiktoken/package.json" 2>/dev/null || true)
  if [[ $have == "$want" ]]; then
    echo "install-deps: js-tiktoken $want present"
    return 0
  fi
  echo "install-deps: npm ci in scripts/tokenizer (js-tiktoken $want)"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
}

missing=()
for p in "${packages[@]}"; do
  # A package counts as present only when dpkg says "install ok installed".
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  install_tokenizer
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if ((EUID == 0)); then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps: missing packages (${missing[*]}) and not root, no sudo: install them yourself" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
install_tokenizer
