#!/usr/bin/env python3
# Prints the error table of docs/validation.md ("Analytic models against measured profiles"): the analytic
# GPT-2 Medium and BERT-Large on the paper-1080ti preset against the bundled measured profiles, per layer kind.
# The numbers come from the calibration test in tests/core/test_analytic.cpp, which also asserts the bounds.
#   python3 scripts/analytic-vs-profile.py [BUILD_DIR]        (default: build; needs tests/test_analytic built)
import os
import subprocess
import sys


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build")
    exe = os.path.join(build, "tests", "test_analytic")
    if not os.path.exists(exe):
        print(f"analytic-vs-profile: {exe} not found; build it with: ninja -C {build} tests/test_analytic",
              file=sys.stderr)
        return 2
    env = dict(os.environ, HARMONY_SOURCE_DIR=root, HARMONY_ANALYTIC_TABLE="1")
    run = subprocess.run([exe, "--test-case=calibration*"], env=env, capture_output=True, text=True)
    for line in run.stdout.splitlines():
        if line.startswith("|") or "CPU update" in line:
            print(line)
    if run.returncode != 0:
        print(run.stdout + run.stderr, file=sys.stderr)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
