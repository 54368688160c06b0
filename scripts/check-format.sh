#!/usr/bin/env bash
# Checks the C++/CUDA sources against .clang-format (clang-format 14).
#   scripts/check-format.sh          list the files that need formatting; exit 1 if any
#   scripts/check-format.sh --fix    format them in place
# Files: *.cpp *.hpp *.cu *.cuh known to git (tracked, plus new files not ignored), else found on disk.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--fix]" >&2; exit 2 ;;
esac

clang_format=${CLANG_FORMAT:-}
if [[ -z $clang_format ]]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1; then clang_format=$c; break; fi
  done
fi
[[ -n $clang_format ]] || { echo "check-format: clang-format not found (apt-get install clang-format)" >&2; exit 2; }

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  while IFS= read -r -d '' f; do
    [[ -f $f ]] && files+=("$f")   # skip files deleted in the work tree but still in the index
  done < <(git ls-files -z --cached --others --exclude-standard -- '*.cpp' '*.hpp' '*.cu' '*.cuh' | sort -zu)
else
  while IFS= read -r -d '' f; do files+=("${f#./}"); done < <(
    find . \( -path './.git' -o -path './build*' -o -path './out' -o -path './subprojects' \) -prune -o \
      -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
fi

if ((${#files[@]} == 0)); then
  echo "check-format: no source files"
  exit 0
fi

if ((fix)); then
  "$clang_format" -i --style=file "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi

bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --dry-run --Werror --style=file "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done

if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of ${#files[@]} files need formatting:"
  printf '  %s\n' "${bad[@]}"
  echo "fix with: scripts/check-format.sh --fix   (or: $clang_format -i FILE)"
  echo "first differences in ${bad[0]}:"
  "$clang_format" --dry-run --style=file "${bad[0]}" 2>&1 | head -n 20 || true
  exit 1
fi
echo "check-format: ${#files[@]} files OK"
