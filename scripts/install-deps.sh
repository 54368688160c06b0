#!/usr/bin/env bash
# Installs harmony's build dependencies on Debian 12, only if one is missing (checked with dpkg -s),
# so a second run is a no-op that needs no network. Runs as root (CI) or through sudo.
#   scripts/install-deps.sh           build deps + the clang tools the checks and fuzzers use + Jupyter and
#                                     matplotlib for the notebooks (scripts/run-notebooks.sh) + headless chromium
#   HARMONY_DEPS_MINIMAL=1 ...        build deps only (enough for scripts/demo.sh)
set -euo pipefail

packages=(
  meson ninja-build pkg-config python3
  libfmt-dev libyaml-cpp-dev doctest-dev libboost-graph-dev nlohmann-json3-dev libcli11-dev
)
# Used by check-format.sh, tidy.sh and the fuzzers (libclang-rt-14-dev carries libFuzzer).
tools=(git clang clang-format clang-tidy libclang-rt-14-dev)
# scripts/run-notebooks.sh executes notebooks/ headless with the Debian Python (/usr/bin/python3) and its
# "python3" kernel; chromium: headless browser for the tests that render pages.
notebooks=(python3-matplotlib python3-nbformat python3-nbclient python3-ipykernel jupyter-nbconvert)
browser=(chromium)
[[ ${HARMONY_DEPS_MINIMAL:-0} == 1 ]] || packages+=("${tools[@]}" "${notebooks[@]}" "${browser[@]}")

missing=()
for p in "${packages[@]}"; do
  # A package counts as present only when dpkg says "install ok installed".
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
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
