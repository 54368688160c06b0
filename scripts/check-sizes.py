#!/usr/bin/env python3
"""Holds the size line of issue 33 for library code (core/, sim/, backend/, apps/; not tests, fuzzers, benches):
no source file over 1,000 lines and no class or struct body over 600. Function bodies are clang-tidy's
readability-function-size (.clang-tidy, scripts/tidy.sh). Exit 1 lists each offender as file:line: what, size.

  python3 scripts/check-sizes.py [--max-file-lines N] [--max-class-lines N] [--report] [FILE...]
"""
import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY_DIRS = ("core", "sim", "backend", "apps")
SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".ipp", ".inc", ".cu", ".cuh"}
# a class-key at a statement start, then the name; what follows up to '{' or ';' decides definition vs declaration
CLASS_HEAD = re.compile(r"(?:^|[;{}]\s*|\n\s*)(?:template\s*<[^;{}]*>\s*)?(class|struct)\s+([A-Za-z_]\w*)")


def library_files():
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *LIBRARY_DIRS],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout.split("\n")
        paths = [ROOT / p for p in out if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for d in LIBRARY_DIRS for p in (ROOT / d).rglob("*")]
    return sorted(p for p in paths if p.is_file() and p.suffix in SUFFIXES and not is_test(p))


def is_test(path):
    name = path.name
    return name.endswith(("_test.cpp", "_test.cu", "_test.hpp")) or name.startswith("test_")


def blank_out(text):
    """The text with comments, string and character literals replaced by spaces (newlines kept), so that
    braces and keywords inside them do not count."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def class_bodies(code):
    """(name, first line, line count) of every class or struct definition in blanked-out code."""
    line_of = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_of[k] = line
        if ch == "\n":
            line += 1
    line_of[len(code)] = line
    found = []
    for m in CLASS_HEAD.finditer(code):
        k = m.end()
        # skip base clauses / attributes up to the body or the end of a declaration
        while k < len(code) and code[k] not in "{;()=":
            k += 1
        if k >= len(code) or code[k] != "{":
            continue  # forward declaration, elaborated type, or a parameter/return type
        depth, j = 0, k
        while j < len(code):
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        found.append((m.group(2), line_of[m.start(1)], line_of[min(j, len(code))] - line_of[k] + 1))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-file-lines", type=int, default=1000)
    ap.add_argument("--max-class-lines", type=int, default=600)
    ap.add_argument("--report", action="store_true", help="also print the five largest files and classes")
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    files = [f.resolve() for f in args.files] if args.files else library_files()
    offenders, file_sizes, class_sizes = [], [], []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        file_sizes.append((lines, str(rel)))
        if lines > args.max_file_lines:
            offenders.append(f"{rel}:1: file of {lines} lines (over {args.max_file_lines}): split it by what it owns")
        for name, first, size in class_bodies(blank_out(text)):
            class_sizes.append((size, f"{rel}:{first}: {name}"))
            if size > args.max_class_lines:
                offenders.append(f"{rel}:{first}: class {name} of {size} lines (over {args.max_class_lines}): split it")
    if args.report:
        print("largest files:", ", ".join(f"{r} {n}" for n, r in sorted(file_sizes, reverse=True)[:5]))
        print("largest classes:", ", ".join(f"{r} {n}" for n, r in sorted(class_sizes, reverse=True)[:5]))
    for o in offenders:
        print(o)
    print(f"check-sizes: {len(files)} files, {len(class_sizes)} classes, {len(offenders)} over the line")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
