#!/usr/bin/env python3
# Times PyTorch's own CPU optimizer step (torch.optim.AdamW on CPU fp32 tensors, the foreach and the for-loop
# implementations) against harmony's host AdamW as `harmony-run probe --long` measures it (cpu_adam.bandwidth), on
# this machine, and prints one table: the local source for cpu_adam.torch_factor (docs/machines.md; results in
# docs/benchmarks.md, "torch.optim.AdamW on the CPU against the host AdamW"). A ratio between two steps on one
# machine: it says nothing of any preset's absolute rate.
#   python3 scripts/torch-adamw-vs-host.py [--build BUILD_DIR] [--params N] [--tensors K] [--runs R] [--threads 1,2]
# Needs torch (Debian: apt-get install python3-torch, then run it with /usr/bin/python3); exit 2 without it.
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fmt_rate(bytes_per_s):
    return f"{bytes_per_s / 1e9:.2f} GB/s"


def time_torch_adamw(torch, params, tensors, runs, threads, foreach):
    """Best and median FP32 parameter bytes per second of torch.optim.AdamW.step() over `params` parameters in
    `tensors` equal CPU tensors, `runs` timed steps after one untimed step (which allocates the moments)."""
    torch.set_num_threads(threads)
    per = params // tensors
    ps = [torch.nn.Parameter(torch.randn(per, dtype=torch.float32)) for _ in range(tensors)]
    for p in ps:
        p.grad = torch.randn(per, dtype=torch.float32) * 1e-3
    opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, foreach=foreach)
    opt.step()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    times.sort()
    work = 4.0 * per * tensors
    return work / times[0], work / times[len(times) // 2]


def probe_rates(build):
    """harmony-run probe --long's host AdamW fp32 rates (best, median) on all threads and on one thread."""
    exe = os.path.join(build, "apps", "harmony-run")
    out = subprocess.run([exe, "probe", "--long", "--quiet", "--format", "json"], check=True, capture_output=True,
                         text=True).stdout
    doc = json.loads(out)
    r = doc["rates"]
    return doc["threads"], {
        "all": (r["adamw_fp32"]["best_bytes_per_s"], r["adamw_fp32"]["median_bytes_per_s"]),
        1: (r["adamw_fp32_one_thread"]["best_bytes_per_s"], r["adamw_fp32_one_thread"]["median_bytes_per_s"]),
    }, doc["rates"]["adamw_fp32"]["work_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder with apps/harmony-run")
    ap.add_argument("--params", type=int, default=16 * 1024 * 1024,
                    help="parameters stepped (default 16M, probe --long's size)")
    ap.add_argument("--tensors", type=int, default=16, help="equal tensors they are split into (default 16)")
    ap.add_argument("--runs", type=int, default=5, help="timed steps per case (default 5, as probe --long)")
    ap.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated (default 1,2)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not importable by this python3 (Debian: apt-get install python3-torch, then run this "
              "script with /usr/bin/python3)", file=sys.stderr)
        return 2
    if args.params <= 0 or args.tensors <= 0 or args.params % args.tensors or args.runs <= 0:
        print("--params must be a positive multiple of --tensors, --runs positive", file=sys.stderr)
        return 2
    threads = [int(t) for t in args.threads.split(",")]

    probe_threads, probe, probe_work = probe_rates(args.build)
    rows = []
    for t in threads:
        ref = probe["all"] if t == probe_threads else probe.get(t)
        for foreach in (True, False):
            best, med = time_torch_adamw(torch, args.params, args.tensors, args.runs, t, foreach)
            rows.append((t, "foreach" if foreach else "for-loop", best, med, ref))

    print(f"torch {torch.__version__}; {args.params} fp32 parameters in {args.tensors} tensors, best / median of "
          f"{args.runs} steps; harmony-run probe --long: {probe_work // 4} parameters, {probe_threads} threads "
          f"(and one), best / median of 5")
    print()
    print("| threads | torch.optim.AdamW | torch best | torch median | host AdamW best | host / torch (best) "
          "| host / torch (median) |")
    print("|---|---|---|---|---|---|---|")
    for t, impl, best, med, ref in rows:
        if ref is None:
            print(f"| {t} | {impl} | {fmt_rate(best)} | {fmt_rate(med)} | - | - | - |")
            continue
        print(f"| {t} | {impl} | {fmt_rate(best)} | {fmt_rate(med)} | {fmt_rate(ref[0])} | {ref[0] / best:.2f}x "
              f"| {ref[1] / med:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
