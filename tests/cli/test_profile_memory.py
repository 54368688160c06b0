#!/usr/bin/env python3
"""A measured profile's memory against harmony-run (issue 36): harmony-run profiles the bundled tiny GPT-2
(configs/run/default.yaml) on the CPU device in fp32 and bf16, then trains Harmony-PP plans whose backward packs hold
one, three and four layers; harmony-sim's simulated peak on that profile is within 5% of harmony-run's measured peak.
A pack's backward runs its layers one after another, so each layer's dY, dX and scratch (the profile's
bwd_transient_memory) is live once, not summed over the pack (docs/native-model.md, "Memory")."""
import json
import os
import sys
import tempfile

import clitest
from clitest import ROOT, check, summary

SIM = sys.argv[1]
RUN = sys.argv[2]
DEFAULT = os.path.join(ROOT, "configs/run/default.yaml")
U = 8
SINGLE_FWD = [[i, i] for i in range(9)]
# One-layer packs: the executor's BWD allocates the buffers that pass input gradients between a pack's layers only
# where the pack has layers to pass them between (it allocated two for every BWD: -5.7% on this GPT's one-layer
# packs; docs/native-model.md, "Memory").
PLANS = {  # name: (packs_fwd, packs_bwd)
    "one-layer packs": (SINGLE_FWD, [[i, i] for i in range(10)]),
    "three-layer packs": ([[0, 5]], [[0, 2], [3, 5], [6, 9]]),
    "a four-layer pack": (SINGLE_FWD, [[0, 0], [1, 4], [5, 8], [9, 9]]),
}


def plan_text(fwd, bwd):
    return (f"{{mode: harmony-pp, gpus: 1, minibatch: {2 * U}, u_fwd: {U}, u_bwd: {U}, packs_fwd: {fwd}, "
            f"packs_bwd: {bwd}}}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("fp32", "bf16"):
            prof = os.path.join(tmp, f"prof_{dtype}.json")
            r = clitest.run(RUN, "profile", DEFAULT, "--dtype", dtype, "--gpu-memory", "1GiB", "--out", prof,
                            "--ubatch", str(U),
                            "--repeats", "1", timeout=600)
            check(f"{dtype}: profile the tiny GPT-2", r.returncode == 0, r.stderr)
            if r.returncode != 0:
                continue
            with open(prof) as f:
                layers = json.load(f)["layers"]
            check(f"{dtype}: the profile records bwd_transient_memory, below bwd_peak_memory",
                  all(0 < l.get("bwd_transient_memory", [0])[0] < l["bwd_peak_memory"][0] for l in layers), layers[1])
            for name, (fwd, bwd) in PLANS.items():
                cfg = os.path.join(tmp, "sim.yaml")
                with open(cfg, "w") as f:
                    f.write(f"model: {{profile: {prof}}}\nmachine: {{preset: cpu-4x, gpu_memory: 1GiB}}\n"
                            f"cost_model: native\noptions: {{prefetch: false}}\nplan: {plan_text(fwd, bwd)}\n")
                s = clitest.run(SIM, "simulate", cfg, "--format", "json", timeout=600)
                check(f"{dtype}, {name}: harmony-sim simulates", s.returncode == 0, s.stderr)
                t = clitest.run(RUN, "train", DEFAULT, "--dtype", dtype, "--steps", "1", "--quiet", "--format", "json",
                                "--gpu-memory", "1GiB", "--set", f"model.profile={prof}", "--set",
                                f"plan={plan_text(fwd, bwd)}", timeout=600)
                check(f"{dtype}, {name}: harmony-run trains", t.returncode == 0, t.stderr)
                if s.returncode != 0 or t.returncode != 0:
                    continue
                predicted = json.loads(s.stdout)["result"]["peak_memory_bytes"]
                measured = json.loads(t.stdout)["summary"]["peak_memory_bytes"]
                err = predicted / measured - 1
                check(f"{dtype}, {name}: simulated peak {predicted} B within 5% of measured {measured} B "
                      f"({100 * err:+.1f}%)", abs(err) <= 0.05, f"{predicted} vs {measured}")
    return summary("cli_profile_memory")


if __name__ == "__main__":
    sys.exit(main())
