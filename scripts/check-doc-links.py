#!/usr/bin/env python3
# Checks every relative Markdown link in the tracked *.md files: the target file exists and, for `file.md#anchor`,
# the anchor is one of its headings (GitHub's slug: lower case, punctuation dropped, spaces to hyphens). Code
# blocks are skipped. Prints `FILE:LINE: what` per broken link and exits 1 if any; run by scripts/test.sh (checks).
import os
import re
import subprocess
import sys


def slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: str, cache: dict) -> set:
    if path not in cache:
        found, in_code = set(), False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("```"):
                    in_code = not in_code
                elif not in_code and re.match(r"#+ ", line):
                    found.add(slug(re.sub(r"^#+ ", "", line)))
        cache[path] = found
    return cache[path]


def main() -> int:
    root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    os.chdir(root)
    files = subprocess.check_output(["git", "ls-files", "*.md"], text=True).split()
    cache: dict = {}
    broken = 0
    for name in files:
        in_code = False
        with open(name, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.startswith("```"):
                    in_code = not in_code
                    continue
                if in_code:
                    continue
                for match in re.finditer(r"\]\(([^)\s]+)\)", line):
                    target = match.group(1)
                    if target.startswith(("http://", "https://", "mailto:")):
                        continue
                    path, _, anchor = target.partition("#")
                    resolved = os.path.normpath(os.path.join(os.path.dirname(name), path)) if path else name
                    if not os.path.exists(resolved):
                        print(f"{name}:{number}: link to a missing file: {target}")
                        broken += 1
                    elif anchor and resolved.endswith(".md") and anchor not in headings(resolved, cache):
                        print(f"{name}:{number}: no heading for the anchor: {target} (headings of {resolved})")
                        broken += 1
    print(f"check-doc-links: {len(files)} files, {broken} broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
