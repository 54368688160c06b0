#!/usr/bin/env python3
"""Counts test results for scripts/test.sh and prints the final `N passed, N failed[, N skipped]` line.

Inputs (any mix, in order):
  a meson testlog.json    one JSON object per line, each with "name" and "result"
  --steps FILE            the step file scripts/test.sh writes; one tab-separated record per line:
                            step  PASS|FAIL|SKIP  name               a check, fuzzer or failed build
                            meson RC  label  path/to/testlog.json   a `meson test` run and its exit code
                          A meson run that exited non-zero without a failing test in its log (crash of
                          the runner, missing log) counts as one failure, so a failure is never lost.
With no inputs it reads build*/meson-logs/testlog.json under the current directory.
Exit status: 1 if anything failed or nothing was counted, else 0.
"""
import glob
import json
import sys

PASSED = {"OK", "EXPECTEDFAIL"}
SKIPPED = {"SKIP"}
# Everything else is a failure: FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS, INTERRUPT, unknown values.


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures = []

    def add(self, outcome, name):
        if outcome == "pass":
            self.passed += 1
        elif outcome == "skip":
            self.skipped += 1
        else:
            self.failed += 1
            self.failures.append(name)


def read_testlog(path, label, tally):
    """Adds every test of one meson testlog; returns the number of failures it held."""
    failures = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                tally.add("fail", f"{label}: {path}:{lineno}: unreadable entry ({e})")
                failures += 1
                continue
            result = str(entry.get("result", "ERROR")).upper()
            name = f"{label}: {entry.get('name', '?')} [{result}]"
            if result in PASSED:
                tally.add("pass", name)
            elif result in SKIPPED:
                tally.add("skip", name)
            else:
                tally.add("fail", name)
                failures += 1
    return failures


def read_steps(path, tally):
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if fields == [""]:
                continue
            if fields[0] == "step" and len(fields) == 3:
                outcome = {"PASS": "pass", "FAIL": "fail", "SKIP": "skip"}.get(fields[1], "fail")
                tally.add(outcome, fields[2])
            elif fields[0] == "meson" and len(fields) == 4:
                rc, label, log = int(fields[1]), fields[2], fields[3]
                try:
                    failures = read_testlog(log, label, tally)
                except FileNotFoundError:
                    failures = 0
                if rc != 0 and failures == 0:
                    tally.add("fail", f"{label}: meson test exited {rc} (see its output above)")
            else:
                tally.add("fail", f"{path}:{lineno}: malformed step record {line!r}")


def main(argv):
    tally = Tally()
    args = list(argv)
    if not args:
        args = sorted(glob.glob("build*/meson-logs/testlog.json"))
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(__doc__)
            return 0
        if arg == "--steps":
            if not args:
                print("count-results: --steps needs a file", file=sys.stderr)
                return 2
            read_steps(args.pop(0), tally)
        else:
            read_testlog(arg, arg.split("/meson-logs/")[0], tally)

    if tally.failures:
        print("Failed:")
        for name in tally.failures:
            print(f"  FAIL {name}")
    if tally.passed + tally.failed + tally.skipped == 0:
        print("count-results: no test results found", file=sys.stderr)
        tally.add("fail", "no test results found")
    line = f"{tally.passed} passed, {tally.failed} failed"
    if tally.skipped:
        line += f", {tally.skipped} skipped"
    print(line)
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
