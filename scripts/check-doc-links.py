#!/usr/bin/env python3
# Checks every relative Markdown link in the tracked *.md files: the target file exists and, for `file.md#anchor`,
# the anchor is one of its headings (GitHub's slug: lower case, punctuation dropped, spaces to hyphens). Code
# blocks are skipped. Also refuses a heading repeated under the same parent heading (a section pasted twice, as
# docs/validation.md once had). With FILE arguments checks only those. Prints `FILE:LINE: what` per problem and exits 1 if any; run by scripts/test.sh.
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


def repeated_sections(name: str) -> list:
    """(line, first line, heading) for each heading that repeats an earlier one under the same parent headings."""
    found, seen, parents, in_code = [], {}, [], False
    with open(name, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                in_code = not in_code
                continue
            match = None if in_code else re.match(r"(#+) (.*)", line)
            if not match:
                continue
            level, title = len(match.group(1)), match.group(2).strip()
            parents = [p for p in parents if p[0] < level]
            key = (tuple(p[1] for p in parents), title)
            if key in seen:
                found.append((number, seen[key], title))
            seen[key] = number
            parents.append((level, title))
    return found


def main() -> int:
    if len(sys.argv) > 1:  # the files named (a test's copies); otherwise every tracked *.md from the root
        files = sys.argv[1:]
    else:
        root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
        os.chdir(root)
        files = subprocess.check_output(["git", "ls-files", "*.md"], text=True).split()
    cache: dict = {}
    broken = 0
    for name in files:
        for number, first, title in repeated_sections(name):
            print(f"{name}:{number}: the heading {title!r} repeats line {first}'s under the same parent; "
                  "merge the two sections or rename one")
            broken += 1
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
    print(f"check-doc-links: {len(files)} files, {broken} broken links or repeated sections")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
