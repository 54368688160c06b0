#!/usr/bin/env bash
# Enforces the dependency rule (docs: core <- sim, core <- backend; sim and backend never meet):
#   core/    must not include "sim/..." or "backend/..."
#   sim/     must not include "backend/..."
#   backend/ must not include "sim/..."
#   core/<room>/ may include only its own and lower rooms of core/, bottom to top:
#     base ← machine ← model ← plan ← program ← output ← search ← kinds ← config
#   sim/<room>/ likewise: engine ← study ← app (and every sim source lives in a room)
# Checks #include lines with "..." or <...>, also written with ../ prefixes. Exit 1 lists offenders.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# dir -> extended regex of the top-level folders it may not include
declare -A forbidden=([core]='sim|backend' [sim]='backend' [backend]='sim')

list_files() {  # list_files DIR: its C/C++/CUDA sources, headers and included fragments
  local dir=$1
  [[ -d $dir ]] || return 0
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- "$dir" |
      grep -zE '\.(c|cc|cpp|cxx|h|hh|hpp|hxx|ipp|inc|cu|cuh)$' || true
  else
    find "$dir" -type f -regextype posix-extended -regex '.*\.(c|cc|cpp|cxx|h|hh|hpp|hxx|ipp|inc|cu|cuh)$' -print0
  fi
}

violations=0
checked=0
for dir in core sim backend; do
  pattern="^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<](\.\./)*(${forbidden[$dir]})/"
  while IFS= read -r -d '' f; do
    [[ -f $f ]] || continue
    checked=$((checked + 1))
    if hits=$(grep -nE "$pattern" "$f"); then
      while IFS= read -r hit; do
        echo "$f:$hit"
        violations=$((violations + 1))
      done <<<"$hits"
    fi
  done < <(list_files "$dir")
done

# core's rooms: each may include only rooms at or below its own level.
rooms=(base machine model plan program output search kinds config)
for ((i = 0; i < ${#rooms[@]}; i++)); do
  room=${rooms[$i]}
  above=("${rooms[@]:$((i + 1))}")
  ((${#above[@]})) || continue
  pattern="^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<](\.\./)*core/($(IFS='|'; echo "${above[*]}"))/"
  while IFS= read -r -d '' f; do
    [[ -f $f ]] || continue
    if hits=$(grep -nE "$pattern" "$f"); then
      while IFS= read -r hit; do
        echo "$f:$hit  (core/$room/ may not include a room above it)"
        violations=$((violations + 1))
      done <<<"$hits"
    fi
  done < <(list_files "core/$room")
done
# sim's rooms: each may include only rooms at or below its own level.
sim_rooms=(engine study app)
for ((i = 0; i < ${#sim_rooms[@]}; i++)); do
  room=${sim_rooms[$i]}
  above=("${sim_rooms[@]:$((i + 1))}")
  ((${#above[@]})) || continue
  pattern="^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<](\.\./)*sim/($(IFS='|'; echo "${above[*]}"))/"
  while IFS= read -r -d '' f; do
    [[ -f $f ]] || continue
    if hits=$(grep -nE "$pattern" "$f"); then
      while IFS= read -r hit; do
        echo "$f:$hit  (sim/$room/ may not include a room above it)"
        violations=$((violations + 1))
      done <<<"$hits"
    fi
  done < <(list_files "sim/$room")
done
while IFS= read -r -d '' f; do
  [[ $f == sim/*/* ]] && continue
  echo "$f: sim/ sources live in a room (sim/engine/, sim/study/, sim/app/)"
  violations=$((violations + 1))
done < <(list_files sim)

# Every core source lives in a room.
while IFS= read -r -d '' f; do
  [[ $f == core/*/* ]] && continue
  echo "$f: core/ sources live in a room (core/base/, core/machine/, ... core/config/)"
  violations=$((violations + 1))
done < <(list_files core)

if ((violations)); then
  echo "check-layering: $violations forbidden include(s): core/ may include only core/, each room only the"
  echo "  rooms below it ($(IFS=' '; echo "${rooms[*]}"), bottom to top), sim/'s rooms likewise"
  echo "  ($(IFS=' '; echo "${sim_rooms[*]}")); sim/ and backend/ may include core/"
  echo "  but not each other. Move shared code down (the mains wire things together)."
  exit 1
fi
echo "check-layering: $checked files OK"
