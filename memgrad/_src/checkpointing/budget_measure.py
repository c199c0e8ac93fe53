"""How a `Budget` finds a plan's peak: the gradients to fetch, the plan-time runs on zeros
(their largest), and Grappler's simulation where the ops cannot run."""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import tensorflow as tf

from memgrad._src.graph.measured import measured_peaks
from memgrad._src.graph.simulate import simulate_peak


# Plan-time runs per peak. Some plans' peaks take two values by the executor's order of ops,
# and five runs could all take the low one: on GPT-2 (2 x 128, batch 8) the step's median
# then measured up to 1.17x a plan's largest of five runs (53 plans, 11 processes), against
# 1.06x its largest of fifteen (41 plans, nine processes, oneDNN on and off).
PLAN_RUNS = 15


class Peak(NamedTuple):
    """A peak found at plan time, in bytes above the baseline.

    ``bytes`` is the largest of the measured runs (a run's peak varies with the executor's
    order of ops, and a step may run in the order of the largest), or the simulated figure.
    ``source``: 'measured', 'simulated', or 'model' when neither could be had (bytes None).
    """

    bytes: Optional[float]
    source: str


NOT_FOUND = Peak(None, "model")


def plain_gradients(view):
    """A plain `tf.gradients` of ``view`` traced on the side (never run by the step:
    TensorFlow prunes, before running a function, the ops no output or stateful op needs),
    or None when it cannot be traced."""
    try:
        with view.graph.as_default(), tf.name_scope("memgrad_budget_plain"):
            grads = tf.gradients(view.ys, view.xs)
    except Exception:  # noqa: BLE001 - no side gradient: the memory model's figures stand
        return None
    return grads if any(g is not None for g in grads) else None


def consumed(graph, grads):
    """A scalar per gradient, to fetch: each gradient is then freed once made, as when a step
    applies it as soon as it exists (a `Variable.assign_sub` per gradient). Fetching the
    gradients themselves would hold them all to the end."""
    with graph.as_default(), tf.name_scope("memgrad_budget_consumer"):
        return [tf.reduce_sum(g.values if isinstance(g, tf.IndexedSlices) else g)
                for g in grads if g is not None]


def held(grads):
    """The tensors of ``grads`` to fetch when measuring: every gradient alive at the end of
    the run, as in a step that applies them all after the backward pass (Keras's fit, and
    ``optimizer.apply(tape.gradient(...))``)."""
    fetched = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            fetched += [g.values, g.indices]
        elif g is not None:
            fetched.append(g)
    return fetched


def peak_of(view, grads, how, hold=None) -> Peak:
    """The measured `Peak` of computing ``grads``, else the simulated one, else `NOT_FOUND`.

    ``hold``: True, each gradient is alive to the end of the run; False, each is consumed as
    made; None, held when measured and consumed when simulated. ``how``: ``(device,
    measure, simulate, kernels)``.
    """
    device, measure, simulate, kernels = how

    @functools.cache
    def fetches(kept):  # built once each: `consumed` adds ops to the graph
        return held(grads) if kept else consumed(view.graph, grads)

    if measure and device is not None:
        fetched = fetches(hold is None or hold)
        runs = measured_peaks(view.graph, fetched, device, runs=PLAN_RUNS, count_outputs=True) if fetched else None
        if runs and runs[len(runs) // 2] > 0:  # a median of 0: nothing was allocated
            return Peak(float(runs[-1]), "measured")
    if simulate:
        fetched = fetches(bool(hold))
        peak = simulated(view.graph, fetched, kernels) if fetched else None
        if peak:
            return Peak(peak, "simulated")
    return NOT_FOUND


def simulated(graph, fetches, kernels=None):
    """Grappler's simulated peak above the baseline of ``fetches``, or None."""
    try:
        peak = simulate_peak(graph, fetches, kernels=kernels).peak_above_baseline_bytes
    except Exception:  # noqa: BLE001 - an unsimulatable graph plans on the memory model alone
        return None
    return float(peak) if peak > 0 else None
