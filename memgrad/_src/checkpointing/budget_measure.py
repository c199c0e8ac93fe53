"""How a `Budget` finds a plan's peak: the gradients to fetch and Grappler's simulation of
the ops they need (deterministic: the same graph gives the same figure in every process)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import tensorflow as tf

from memgrad._src.graph.simulate import simulate_peak


class Peak(NamedTuple):
    """A peak found at plan time, in bytes above the baseline.

    ``bytes``: the simulated figure. ``source``: 'simulated', or 'model' when none could be
    had (bytes None).
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


def peak_of(view, grads, kernels, hold=True) -> Peak:
    """The simulated `Peak` of computing ``grads``, else `NOT_FOUND`.

    ``kernels``: the device whose kernels' scratch buffers are counted (None: not counted).
    ``hold``: True, each gradient is alive to the end of the run; False, each is consumed as
    made.
    """
    fetched = held(grads) if hold else consumed(view.graph, grads)
    peak = simulated(view.graph, fetched, kernels) if fetched else None
    return Peak(peak, "simulated") if peak else NOT_FOUND


def simulated(graph, fetches, kernels=None):
    """Grappler's simulated peak above the baseline of ``fetches``, or None."""
    try:
        peak = simulate_peak(graph, fetches, kernels=kernels).peak_above_baseline_bytes
    except Exception:  # noqa: BLE001 - an unsimulatable graph plans on the memory model alone
        return None
    return float(peak) if peak > 0 else None
