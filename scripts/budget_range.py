"""A Budget's plans across the range from 'memory' to plain backprop, on one model, in one run.

For each budget (a fraction of plain backprop's modelled peak) and for 'memory': the plan's
recomputed FLOPs (modelled, share of the forward pass), the ops it recomputes (copies that
run, and all copies made), the step's measured peak and its time, each against 'memory''s
and plain's measured side by side (interleaved rounds, medians; the fastest and slowest
round in brackets). What "recomputes less as the budget grows" means, measured.

    python scripts/budget_range.py                          # GPT-2 6x384, 0.3 to 0.9
    python scripts/budget_range.py --model densenet121 --fractions 0.6 0.8 --rounds 5

The step applies each gradient as it is made (one `assign_sub` per variable), so the Budgets
are `hold_gradients=False` (as in `scripts/first_call.py`, whose models these are).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MiB = 2**20


def measure(name, fractions, rounds):
    """Rows ``{variant, flops_share, recomputed, copied, peak, seconds: [per round]}``."""
    import tensorflow as tf

    import memgrad
    from first_call import model_and_batch, sgd_step

    model, x = model_and_batch(name)
    variants = {"plain": tf.GradientTape, "memory": lambda: memgrad.GradientTape(checkpoints="memory")}
    for fraction in fractions:
        budget = memgrad.strategies.Budget(fraction, hold_gradients=False)
        variants[f"Budget({fraction}, hold_gradients=False)"] = (
            lambda budget=budget: memgrad.GradientTape(checkpoints=budget))
    rows = []
    for variant, tape_fn in variants.items():
        step = sgd_step(model, tape_fn)
        with memgrad.record_rewrites() as log:
            try:
                step(x).numpy()
            except memgrad.BudgetError as error:
                rows.append({"variant": variant, "failure": str(error).split(". Expected")[0]})
                continue
        details = log[0].plan.details if log and log[0].plan is not None else {}
        share = (details["recomputed_flops"] / details["forward_flops"]
                 if details.get("forward_flops") else None)
        peak = memgrad.profiler.measure(step, (x,)).peak_above_baseline_bytes
        rows.append({"variant": variant, "step": step, "flops_share": share, "peak": peak, "seconds": [],
                     "recomputed": sum(r.recomputed_ops for r in log), "copied": sum(r.copied_ops for r in log)})
    timed = [row for row in rows if "step" in row]
    for _ in range(rounds):  # interleaved: every variant once per round
        for row in timed:
            start = time.perf_counter()
            row["step"](x).numpy()
            row["seconds"].append(time.perf_counter() - start)
    return rows


def table(name, rows):
    by = {row["variant"]: row for row in rows}
    plain = statistics.median(by["plain"]["seconds"])
    memory = by["memory"]
    memory_extra = statistics.median(memory["seconds"]) - plain
    lines = [f"{name}: every variant against plain backprop and 'memory', measured side by side",
             "",
             "| variant | recomputed FLOPs (modelled, of the forward) | ops recomputed (copied) | ops vs 'memory' "
             "| peak MiB | time vs plain (fastest-slowest) | extra time vs 'memory''s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if "failure" in row:
            lines.append(f"| {row['variant']} | refused: {row['failure']} | | | | | |")
            continue
        median = statistics.median(row["seconds"])
        share = "n/a" if row["flops_share"] is None else f"{row['flops_share']:.0%}"
        ops_ratio = f"{row['recomputed'] / memory['recomputed']:.2f}x" if memory["recomputed"] else ""
        extra = f"{(median - plain) / memory_extra:.2f}x" if memory_extra > 0 else ""
        lines.append(
            f"| {row['variant']} | {share} | {row['recomputed']} ({row['copied']}) | {ops_ratio} "
            f"| {row['peak'] / MiB:.1f} | {median / plain:.2f}x ({min(row['seconds']) / plain:.2f}-"
            f"{max(row['seconds']) / plain:.2f}) | {extra} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from first_call import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.9],
                        help="Budget fractions of plain backprop's modelled peak (default: 0.3 0.5 0.7 0.9)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per variant (default: 20)")
    args = parser.parse_args(argv)
    if any(not 0 < f <= 1 for f in args.fractions):
        parser.error(f"--fractions: expected fractions in (0, 1]; received {args.fractions}")
    print(table(MODELS[args.model], measure(args.model, args.fractions, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
