"""What the CLI tests in tests/cli/ share: the source root they run in, the tally of checks (a failed check is
recorded, the test goes on, and the summary exits 1), running a binary with its output captured, and writing a
small file. tests/meson.build runs each test as `python3 tests/cli/test_X.py BINARY...`, so Python puts this
folder first on sys.path and `from clitest import ...` works from any build folder (release, sanitizer, a fresh
clone's) with no PYTHONPATH."""
import json
import os
import signal
import subprocess
import sys

# The source root (tests/meson.build sets HARMONY_SOURCE_DIR): where the binaries run and the configs are found.
ROOT = os.path.abspath(os.environ.get("HARMONY_SOURCE_DIR", "."))
# tests/meson.build: an ASan/UBSan build (~10x slower); the long cases run on smaller inputs.
SANITIZED = os.environ.get("HARMONY_SANITIZED") == "1"

# The registered plan kinds in listing order: the outputs' plan_kind enum, which tests/core/test_plan_kinds.cpp checks
# against the registry (so a new kind changes no list here).
with open(os.path.join(ROOT, "schemas", "common.schema.json")) as _f:
    PLAN_KINDS = json.load(_f)["definitions"]["plan_kind"]["enum"]


_KINDS = {}  # per harmony-sim binary: its `kinds --format json` listing, read once


def registered_kinds(sim):
    """The registry as `harmony-sim kinds --format json` lists it (each kind's name and properties), read once per
    binary."""
    if sim not in _KINDS:
        r = subprocess.run([sim, "kinds", "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           check=True)
        _KINDS[sim] = json.loads(r.stdout)["kinds"]
    return _KINDS[sim]


def trained_kinds(sim):
    """The kinds harmony-run trains, in listing order (PlanKindSpec::trains); the others harmony-sim prices and
    harmony-run refuses at plan.mode."""
    return [k["name"] for k in registered_kinds(sim) if k["trains"]]


def one_gpu_kinds(sim):
    """The kinds that run on one GPU only (PlanKindSpec::one_gpu)."""
    return [k["name"] for k in registered_kinds(sim) if k["one_gpu"]]


failures = []  # "name: detail" of each failed check; a test reads it, never rebinds it
passed = 0  # read it as clitest.passed: `from clitest import passed` copies the number once


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(f"{name}: {str(detail)[:3000]}")


# The signals a binary handles or leaves to their default action; a test's children start with each at its default,
# whatever the test inherited (nohup ignores SIGHUP, a shell's background job SIGINT), since the binaries keep a signal
# ignored at start ignored (docs/config.md, exit codes).
KERNEL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)


def default_signals():
    """preexec_fn: every KERNEL_SIGNALS at its default disposition in the child."""
    for sig in KERNEL_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def run(binary, *args, timeout=300, cwd=ROOT, stdout=subprocess.PIPE, **kw):
    """BINARY ARGS run in the source root, stderr (and stdout, unless sent elsewhere) captured as text; the child's
    signals at their defaults (default_signals) unless the caller passes its own preexec_fn."""
    kw.setdefault("preexec_fn", default_signals)
    return subprocess.run([binary, *args], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          timeout=timeout, **kw)


def runner(binary, **defaults):
    """run() bound to one binary and defaults: `run = runner(BIN, timeout=120)`, then run("compare", ...) or
    run(..., binary=OTHER) for another binary with the same defaults."""
    def run_bound(*args, binary=binary, **kw):
        return run(binary, *args, **{**defaults, **kw})
    return run_bound


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def write_in(folder, name, text):
    return write(os.path.join(folder, name), text)


def summary(prefix=""):
    """Prints the tally and each failure; returns the exit status (1 if any check failed)."""
    print(f"{prefix}{passed} checks passed, {len(failures)} failed")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


def finish(prefix=""):
    sys.exit(summary(prefix))
