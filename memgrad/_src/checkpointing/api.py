"""`memgrad.gradients`, a drop-in for `tf.gradients`, as the steps one call takes: check the
arguments, read the forward graph, plan, rewrite (a strategy may refine its plan), check that
no gradient was lost, record. Anything the rewrite cannot handle falls back to plain
`tf.gradients` with a warning."""

import functools
import warnings

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing import gradient_walk, recording
from memgrad._src.checkpointing.aggregate import aggregate
from memgrad._src.checkpointing.fallback import (
    crash_reason, is_internal_failure, lost_gradients, outside_graph_of_ys, unsupported_op,
)
from memgrad._src.checkpointing.graph_lock import raise_if_locked
from memgrad._src.checkpointing.gradients_call import checked_call
from memgrad._src.checkpointing.loops import LOOP_TYPES
from memgrad._src.checkpointing.rewrite import rewrite_gradients
from memgrad._src.checkpointing.rewrite_log import copies_that_run, record, rewrites_recorded
from memgrad._src.checkpointing.strategies import checked_plan, choose
from memgrad._src.graph.view import ForwardGraph

# TensorFlow's own functions, kept before any patch so memgrad never calls itself.
TF_GRADIENTS_V1 = tf_internals.tf_gradients_v1
TF_GRADIENTS_V2 = tf_internals.tf_gradients_v2


@tf.autograph.experimental.do_not_convert
def gradients(ys, xs, grad_ys=None, checkpoints="memory", name="gradients", **kwargs):
    """Gradients of `ys` with respect to `xs` that keep only some forward tensors.

    A drop-in for `tf.gradients` inside a `tf.function`: the forward tensors not kept as
    checkpoints are recomputed segment by segment during the backward pass, each segment
    only once its incoming gradient exists. Results equal `tf.gradients` up to float
    rounding.

    Args:
      ys: a tensor or list of tensors to differentiate (summed, like `tf.gradients`).
      xs: a tensor, variable, or list of them.
      grad_ys: optional incoming gradients, one per y.
      checkpoints: `'memory'` (separators spaced by bytes, about sqrt(n) of them),
        `'speed'` (no matrix product or convolution recomputed, never more kept than plain
        backprop keeps), `'collection'` (tensors marked with `memgrad.mark_checkpoint`), a list
        of tensors to keep, or `memgrad.strategies.Budget(bytes_or_fraction)`: the plan
        recomputing least, among a fixed set of candidates, whose peak, measured at trace
        time, fits the budget.
      name: a name scope for the gradient ops.
      **kwargs: passed to `tf.gradients`: `gate_gradients`, `aggregation_method`,
        `stop_gradients`, `unconnected_gradients`, `colocate_gradients_with_ops`.

    Returns:
      A list with one gradient (a tensor, `tf.IndexedSlices`, or None) per x.

    Like `tf.gradients`, an x no y depends on gets None (or zeros with
    `unconnected_gradients='zero'`), `xs=[]` gives `[]`, a repeated x gets its gradient at
    every position, and an x computed inside the forward pass from other xs (an
    intermediate tensor) gets the gradient reaching it while the xs upstream of it get
    their whole gradient, including the part that flows through it.

    Caveats:
      - XLA: under ``jit_compile=True`` each recomputed segment reads its checkpoints
        through a data dependency on its incoming gradient, which XLA keeps (it drops
        control dependencies), so the recomputation runs late and is not merged with the
        forward ops: the saving holds (measured on CPU's XLA; see docs/checkpointing.md).
      - Stateful ops are never re-run: unseeded random ops (``tf.random.uniform``,
        ``tf.nn.dropout``, a ``tf.random.Generator``), variable reads and updates run once
        and their outputs are kept, so the gradients belong to the forward's own random
        draw and those outputs cost their memory. Seeded stateless ops (Keras's Dropout)
        are recomputed and give the same values.
      - Unconnected and unused sources: an x no y depends on gets None, or zeros with
        ``unconnected_gradients='zero'``, exactly like `tf.gradients` (there is no tape,
        so nothing is "unwatched").

    Raises:
      RuntimeError: when called eagerly.
      AttributeError: when ``ys`` or ``xs`` is None or holds None (the error `tf.gradients`
        raises for them).
      TypeError: when ys or xs hold something other than graph tensors (or variables, for
        xs), or ``checkpoints`` is of no accepted kind.
      ValueError: when a checkpoint is not a forward tensor, ``checkpoints`` is an unknown
        string, or `grad_ys` do not match ys in number, shape or dtype.
      memgrad.BudgetError: when no plan fits a `Budget`; it states the smallest that does.

    Example:
      ```python
      @tf.function
      def train_step(x, y):
          loss = loss_fn(y, model(x, training=True))
          grads = memgrad.gradients(loss, model.trainable_variables)
          optimizer.apply_gradients(zip(grads, model.trainable_variables))
      ```
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "memgrad.gradients works inside a graph (a tf.function), like tf.gradients. "
            "Received a call in eager mode: wrap the training step in @tf.function, or use "
            "memgrad.GradientTape, which falls back to tf.GradientTape when eager."
        )
    call = checked_call(ys, xs, grad_ys, checkpoints, name, kwargs)
    if not call.xs:
        return []
    if not call.ys:
        return unconnected_gradients_for(call.xs, call.unconnected)
    plain = functools.partial(
        TF_GRADIENTS_V1, call.ys, call.xs, grad_ys=call.grad_ys, name=name,
        stop_gradients=call.stop_gradients or None, unconnected_gradients=call.unconnected, **call.kwargs)
    # TensorFlow's and the rewrite's sums of gradient parts in an order AddN accepts
    # (`gradient_walk.add_n_order`), the plain fallback's included.
    with gradient_walk.ordered_gradient_sums():
        try:
            view = _forward_graph(call)
            if not view.ops:
                return _no_forward_ops(call)
            plan = _guarded("planning", call.strategy, choose, view, call.strategy)
            if _plain_by_plan(view, plan, call):
                return _plain_gradients(plain)
            grads, rewrite, plan = _rewrite_and_refine(view, plan, call)
            lost = lost_gradients(call.ys, call.xs, grads, call.grad_ys, call.stop_gradients)
            if lost is not None:
                raise _FallBack(lost, plan)
        except _FallBack as fallback:
            plan = fallback.plan
            return _fall_back(plain, plan.mode if plan is not None else call.mode, plan, fallback.reason)
    if rewrites_recorded():  # the walk over the step's graph serves only the log
        running = copies_that_run(rewrite.copies, grads)
        record(
            copied_ops=rewrite.copied_ops, recomputed_ops=len(running),
            recomputed_flops=float(sum(view.op_flops(op) for op in running)), segments=rewrite.segments,
            in_place_segments=rewrite.in_place_segments,
            gradient_seconds=rewrite.gradient_seconds, checkpoints=len(plan.tensors), mode=plan.mode,
            estimated_bytes=plan.estimated_bytes, plan=plan, loops=tuple(rewrite.loops.records))
    if call.unconnected == tf.UnconnectedGradients.ZERO:
        grads = [tf.zeros_like(x) if g is None else g for g, x in zip(grads, call.xs)]
    return grads


class _FallBack(Exception):
    """Why this call runs plain `tf.gradients` (with the plan, once there is one)."""

    def __init__(self, reason, plan=None):
        super().__init__(reason)
        self.reason, self.plan = reason, plan


def _guarded(step, strategy, function, *args, plan=None):
    """``function(*args)``; an internal failure of it becomes a fallback naming ``step`` (with
    ``plan``, the plan made so far), while what the caller caused (a budget no plan fits, a
    bad argument) is raised as it is."""
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 - what the caller caused is raised again
        if not is_internal_failure(error, strategy):
            raise
        raise_if_locked(error, step)  # a fallback would hang
        raise _FallBack(crash_reason(step, error), plan) from error


def _forward_graph(call):
    """The forward ops between ``call.xs`` and ``call.ys``, or a fallback saying why not."""
    nested = outside_graph_of_ys(call.ys, call.xs)
    if nested is not None:
        raise _FallBack(nested)
    try:
        view = ForwardGraph(call.ys, call.xs)
    except Exception as error:  # noqa: BLE001 - the view raises nothing on purpose
        raise _FallBack(crash_reason("reading the forward graph", error)) from error
    unsupported = unsupported_op(view) if view.ops else None
    if unsupported is not None:
        raise _FallBack(unsupported)
    return view


def _no_forward_ops(call):
    """Gradients when no y depends on any x through an op. tf.gradients' answer: an x that is
    itself a y gets that y's incoming gradient (ones by default); any other x, None or zeros.
    An x the view finds unconnected while tf.gradients differentiates it (through a path the
    view does not follow) takes tf.gradients."""
    lost = lost_gradients(
        call.ys, call.xs, _identity_gradients(call.ys, call.xs, call.grad_ys, tf.UnconnectedGradients.NONE),
        call.grad_ys, call.stop_gradients)
    if lost is not None:
        raise _FallBack(lost)
    record(mode="unconnected")
    return _identity_gradients(call.ys, call.xs, call.grad_ys, call.unconnected)


def _plain_by_plan(view, plan, call):
    """Whether ``plan`` is plain backprop (recorded, and warned where the strategy did not
    choose it: 'memory' finding nothing worth keeping, marks off this call's paths)."""
    loops = any(op.type in LOOP_TYPES for op in view.ops)
    # Under a tape that records the ys (a gradient of this gradient), a loop's gradient goes
    # through memgrad's loop gradients even in a plain plan: the tape differentiates
    # TensorFlow's own (what plain tf.gradients builds) wrongly. A memgrad tape of this graph
    # differentiates the graph instead, as tf.gradients twice does, so it does not count.
    taped_loops = loops and recording.recorded_by_a_tape(call.ys, "a gradient through a loop")
    if plan.tensors or (loops and plan.loops == "segments") or taped_loops:
        return False
    reason = ""
    if not plan.details.get("same_as_plain"):  # a budget plain backprop fits, 'speed' keeping plain's set
        what = ("none of the tensors marked with memgrad.mark_checkpoint lies between xs and ys"
                if plan.mode == "collection" else "found nothing worth keeping")
        reason = f"{what} in a graph of {len(view.ops)} forward ops"
        warnings.warn(f"memgrad.gradients(checkpoints={plan.mode!r}): {reason}; using plain tf.gradients "
                      "for it.", stacklevel=3)
    record(mode=plan.mode, fallback=True, plan=plan, fallback_reason=reason)
    return True


def _rewrite_and_refine(view, plan, call):
    """``(grads, rewrite, plan)``: the rewrite of ``plan``, rebuilt while the strategy's
    ``refine`` replaces the plan on seeing it (a Budget measures its peak; a rewrite built
    and replaced is never run: TensorFlow prunes it)."""
    gradients_fn = functools.partial(TF_GRADIENTS_V1, unconnected_gradients="none", name="backprop")
    for _ in range(MAX_REFINEMENTS + 1):
        try:
            with tf.name_scope("memgrad_" + call.name.replace("gradients", "grad")):
                grads, rewrite = rewrite_gradients(view, plan.tensors, call.grad_ys, gradients_fn, call.kwargs,
                                                   call.stop_gradients, loops=plan.loops)
        except Exception as error:  # noqa: BLE001 - any failure of the rewrite falls back
            raise_if_locked(error, "building the rewrite")
            raise _FallBack(crash_reason("building the rewrite", error), plan) from error
        following = _guarded("refining the plan", call.strategy, _refined, call.strategy, view, plan, grads,
                             plan=plan)
        if following is None:
            return grads, rewrite, plan
        plan = following
    raise RuntimeError(
        f"{type(call.strategy).__name__}.refine returned a new plan {MAX_REFINEMENTS} times "
        f"in a row; expected None (keep the plan) within {MAX_REFINEMENTS} rewrites.")


def _plain_gradients(plain):
    """``plain()`` (TensorFlow's tf.gradients); what it raises is marked as its own."""
    try:
        return plain()
    except Exception as error:
        error.memgrad_raised_by_tf_gradients = True
        raise


def raised_by_tf_gradients(error):
    """Whether ``error`` came from the plain tf.gradients memgrad ran (not from memgrad)."""
    return getattr(error, "memgrad_raised_by_tf_gradients", False)


def _identity_gradients(ys, xs, grad_ys, unconnected):
    """Gradients when no op lies between xs and ys: only an x that is a y has one."""
    results = unconnected_gradients_for(xs, unconnected)
    for i, x in enumerate(xs):
        if not tf.is_symbolic_tensor(x):
            continue
        parts = [tf.ones_like(y) if dy is None else dy
                 for y, dy in zip(ys, grad_ys) if y.ref() == x.ref()]
        if parts:
            results[i] = aggregate(parts)
    return results


def unconnected_gradients_for(xs, unconnected):
    """What tf.gradients returns for xs no y depends on: None, or zeros."""
    if unconnected == tf.UnconnectedGradients.ZERO:
        return [tf.zeros_like(x) for x in xs]
    return [None] * len(xs)


# How many times a strategy's ``refine`` may replace its plan in one call.
MAX_REFINEMENTS = 64


def _refined(strategy, view, plan, grads):
    """The plan ``strategy.refine`` returns after a rewrite (None: keep ``plan``)."""
    refine = getattr(strategy, "refine", None)
    if refine is None:
        return None
    return checked_plan(strategy, refine(view, plan, grads), "refine(view, plan, grads)",
                        optional=True)


def _fall_back(plain, mode, plan, reason):
    """Plain tf.gradients for a graph the rewrite cannot handle, with one warning."""
    warnings.warn(
        f"memgrad.gradients(checkpoints={mode!r}) cannot rewrite this graph: {reason}. "
        "Using plain tf.gradients for it (no memory saved).",
        stacklevel=3,
    )
    record(mode=mode, fallback=True, plan=plan, fallback_reason=reason)
    return _plain_gradients(plain)
