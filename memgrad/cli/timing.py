"""Timing memgrad-profile's steps: rounds of calls, side by side, median of the round means."""

from __future__ import annotations

import gc

from memgrad.cli.arguments import SLOW_STEP_ROUNDS, SLOW_STEP_S, TIMED_ROUNDS


def time_steps(entries, rounds=TIMED_ROUNDS, round_s=0.1):
    """Times steps side by side: each round runs every step in turn, so the steps share the
    machine's slow and fast moments and their ratios hold still.

    Args:
      entries: ``(step, inputs, first_s)`` per step: the step (already traced), its
        arguments and a first estimate of one call's time, which sets its calls per round.
      rounds: timed rounds (`SLOW_STEP_ROUNDS` at most when a step is slower than
        `SLOW_STEP_S` seconds).
      round_s: the least time each step runs per round.

    Returns:
      ``[(seconds per step, spread, round means)]`` in the order of ``entries``: the median
      of the step's round means, their spread (largest minus smallest mean, over the median),
      and the means themselves.
    """
    import statistics
    import time

    import tensorflow as tf

    def _sync():  # kernels launch asynchronously on a GPU: wait for them before the clock
        if tf.config.list_logical_devices("GPU"):
            tf.test.experimental.sync_devices()

    if not entries:
        return []
    per_round = [max(1, min(1000, int(round_s / max(first_s, 1e-6)) + 1)) for _, _, first_s in entries]
    if max(first_s for _, _, first_s in entries) > SLOW_STEP_S:
        rounds = min(rounds, SLOW_STEP_ROUNDS)
    means = [[] for _ in entries]
    collecting = gc.isenabled()
    gc.disable()  # as timeit does: no collector pause lands in one strategy's round
    try:
        for _ in range(rounds):
            for index, (step, inputs, _) in enumerate(entries):
                start = time.perf_counter()
                for _ in range(per_round[index]):
                    step(*inputs)
                _sync()
                means[index].append((time.perf_counter() - start) / per_round[index])
    finally:
        if collecting:
            gc.enable()
    results = []
    for found in means:
        median = statistics.median(found)
        results.append((median, (max(found) - min(found)) / median if median else 0.0, found))
    return results


def time_side_by_side(spec, depth, batch_size, fast):
    """Rebuilds the fast steps of one point and times them together (`time_steps`); each row
    gets ``ms_per_step``, ``time_spread`` and its round means for a paired overhead. If they do
    not fit together, each is timed alone."""
    import tensorflow as tf

    from memgrad.cli import sweep

    if not fast:
        return
    group = object()
    workloads = []
    try:
        for row, first_s in fast:
            step, inputs, model = sweep.workload(spec, row["strategy"], depth, batch_size)
            for _ in range(3):  # traces, then warms up (the allocator grows its regions at first)
                step(*inputs)
            workloads.append((row, step, inputs, model, first_s))
        timed = time_steps([(step, inputs, first_s) for _, step, inputs, _, first_s in workloads])
    except tf.errors.ResourceExhaustedError:
        workloads.clear()
        sweep.release()
        for row, first_s in fast:
            step, inputs, model = sweep.workload(spec, row["strategy"], depth, batch_size)
            step(*inputs)
            ((seconds, spread, _),) = time_steps([(step, inputs, first_s)])
            row.update(ms_per_step=seconds * 1e3, time_spread=spread)
            del step, inputs, model
            sweep.release()
        return
    for (row, *_), (seconds, spread, means) in zip(workloads, timed):
        row.update(ms_per_step=seconds * 1e3, time_spread=spread, _round_means=means, _timed_with=group)
    workloads.clear()
    sweep.release()
