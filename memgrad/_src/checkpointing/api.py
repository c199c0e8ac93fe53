"""`memgrad.gradients`, a drop-in for `tf.gradients`, and the monkey patch that installs it."""

import contextlib
import dataclasses
import functools
import threading
import warnings

import numpy as np
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing import recording
from memgrad._src.checkpointing.aggregate import aggregate
from memgrad._src.checkpointing.fallback import (
    crash_reason, is_internal_failure, lost_gradients, outside_graph_of_ys, unsupported_op,
)
from memgrad._src.checkpointing.loops import LOOP_TYPES
from memgrad._src.checkpointing.rewrite import rewrite_gradients
from memgrad._src.checkpointing.strategies import COLLECTION, as_strategy, checked_plan, choose
from memgrad._src.graph.view import ForwardGraph

# TensorFlow's own functions, kept before any patch so memgrad never calls itself.
TF_GRADIENTS_V1 = tf_internals.tf_gradients_v1
TF_GRADIENTS_V2 = tf_internals.tf_gradients_v2
_recorders = []  # the lists of every active record_rewrites() block (any thread)
_recorders_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RewriteRecord:
    """What one `memgrad.gradients` call did, as logged by `record_rewrites`.

    Attributes:
      mode: the strategy's name (``'memory'``, ``'speed'``, ``'collection'``, ``'list'``,
        ``'budget'``, a user strategy's ``name``), or ``'unconnected'``.
      segments: segments of the forward pass recomputed separately (0: no rewrite).
      copied_ops: forward ops copied for recomputation.
      recomputed_ops: the copies that run: those some gradient reads, directly or through
        other copies. TensorFlow prunes the rest before the step runs (a copied matrix
        product whose gradient reads only its inputs).
      checkpoints: tensors kept.
      fallback: True when plain `tf.gradients` ran instead of the rewrite: nothing was worth
        keeping, or the rewrite could not handle the graph (`fallback_reason` says why; a
        warning said so too).
      estimated_bytes: the strategy's estimate of the activation peak.
      gradient_seconds: time spent inside `tf.gradients` while building the rewrite.
      plan: the `CheckpointPlan` (``plan.details`` holds a `Budget`'s figures), or None.
      loops: one `memgrad.LoopRecord` per forward loop differentiated: whether its
        gradient ran in segments of steps, replayed the whole loop, or kept TensorFlow's
        per-step intermediates, and why.
      fallback_reason: why plain `tf.gradients` ran, as the warning said ('' where the
        rewrite ran, and where the plan itself is plain backprop: a budget plain backprop
        fits, 'speed' keeping what plain backprop keeps).
    """

    mode: str
    segments: int = 0
    copied_ops: int = 0
    checkpoints: int = 0
    fallback: bool = False
    estimated_bytes: float = 0.0
    gradient_seconds: float = 0.0
    plan: object = None
    loops: tuple = ()
    fallback_reason: str = ""
    recomputed_ops: int = 0


@contextlib.contextmanager
def record_rewrites():
    """Logs every `memgrad.gradients` call traced inside the block (from any thread).

    `memgrad.GradientTape`, `monkey_patch` and the Keras fit hook go through
    `memgrad.gradients`, so their calls are logged too. A ``tf.function`` is rewritten when
    it is traced, not when it runs again: wrap its first call.

    Returns:
      A context manager whose value is a list, filled with one `RewriteRecord` per call.

    Example:
      ```python
      with memgrad.record_rewrites() as log:
          train_step(x, y)            # a tf.function using memgrad.GradientTape
      print(log[0].segments, log[0].plan.estimated_bytes)
      ```
    """
    log = []
    with _recorders_lock:
        _recorders.append(log)
    try:
        yield log
    finally:
        with _recorders_lock:
            # By identity: two nested logs of the same calls are equal lists.
            del _recorders[next(i for i, r in enumerate(_recorders) if r is log)]


def _record(**fields):
    if not _recorders:
        return
    entry = RewriteRecord(**fields)
    with _recorders_lock:
        for log in _recorders:
            log.append(entry)


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


def record_fallback(mode, reason):
    """Notes, for `record_rewrites`, a gradient memgrad left to TensorFlow (``reason``)."""
    _record(mode=mode, fallback=True, fallback_reason=reason)


def _as_list(value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _check_not_none(ys, xs):
    """tf.gradients' AttributeError for a ``None`` ys, xs or entry of them, with a clear message."""
    for name, value in (("ys", ys), ("xs", xs)):
        entries = value if isinstance(value, (list, tuple)) else [value]
        for i, entry in enumerate(entries):
            if entry is None:
                where = name if value is None else f"{name}[{i}]"
                # tf.gradients raises AttributeError ('NoneType' object has no attribute 'op').
                raise AttributeError(
                    f"memgrad.gradients expects {name} to be a tensor or a list of tensors"
                    f"{' or variables' if name == 'xs' else ''}, like tf.gradients (which "
                    f"raises AttributeError: 'NoneType' object has no attribute 'op'). "
                    f"Received: {where}=None"
                )


def _check_inputs(ys, xs, grad_ys):
    graph = None
    for y in ys:
        if not tf.is_symbolic_tensor(y):
            raise TypeError(
                "ys must be graph tensors computed inside the tf.function. Received: "
                f"{type(y).__name__} {y!r}"
            )
        if graph is None:
            graph = y.graph
        elif y.graph is not graph:
            raise ValueError("All ys must belong to one graph. Received ys from two graphs.")
    for x in xs:
        is_tensor = tf.is_symbolic_tensor(x)
        if not is_tensor and not hasattr(x, "handle") and not isinstance(x, tf.Variable):
            raise TypeError(
                "xs must be graph tensors or variables. Received: "
                f"{type(x).__name__} {x!r}"
            )
    if grad_ys is not None:
        if len(grad_ys) != len(ys):
            raise ValueError(
                f"grad_ys must have one entry per y. Received {len(grad_ys)} for {len(ys)} ys."
            )
        for i, (y, dy) in enumerate(zip(ys, grad_ys)):
            _check_grad_y(i, y, dy)


def _check_grad_y(i, y, dy):
    """Checks an incoming gradient against its y here, not deep inside a gradient op."""
    if dy is None:
        return
    if isinstance(dy, tf.IndexedSlices):
        dy = dy.values
    shape = getattr(dy, "shape", None)
    if shape is None:
        shape = tf.TensorShape(np.shape(dy))
    if not tf.TensorShape(shape).is_compatible_with(y.shape):
        raise ValueError(
            f"grad_ys[{i}] must have the shape of ys[{i}], {y.shape}. "
            f"Received: shape {tf.TensorShape(shape)}."
        )
    dtype = getattr(dy, "dtype", None)
    if isinstance(dtype, tf.DType) and dtype != y.dtype:
        raise ValueError(
            f"grad_ys[{i}] must have the dtype of ys[{i}], {y.dtype.name}. "
            f"Received: dtype {dtype.name}."
        )


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
    _check_not_none(ys, xs)
    as_strategy(checkpoints)  # an unknown strategy fails here, whatever the graph
    ys = _as_list(ys) or []
    xs = _as_list(xs) or []
    grad_ys = _as_list(grad_ys)
    _check_inputs(ys, xs, grad_ys)
    if grad_ys is None:
        grad_ys = [None] * len(ys)
    stop_gradients = _as_list(kwargs.pop("stop_gradients", None)) or []
    unconnected = kwargs.pop("unconnected_gradients", tf.UnconnectedGradients.NONE)
    unconnected = tf.UnconnectedGradients(unconnected)
    if not xs:
        return []
    if not ys:
        return unconnected_gradients_for(xs, unconnected)

    plain = functools.partial(
        TF_GRADIENTS_V1, ys, xs, grad_ys=grad_ys, name=name,
        stop_gradients=stop_gradients or None, unconnected_gradients=unconnected, **kwargs)
    strategy = as_strategy(checkpoints)
    mode = getattr(strategy, "name", "strategy")
    nested = outside_graph_of_ys(ys, xs)
    if nested is not None:
        return _fall_back(plain, mode, None, nested)
    try:
        view = ForwardGraph(ys, xs)
    except Exception as error:  # noqa: BLE001 - the view raises nothing on purpose
        return _fall_back(plain, mode, None, crash_reason("reading the forward graph", error))
    if not view.ops:
        # No y depends on any x through an op. tf.gradients' answer: an x that is itself a
        # y gets that y's incoming gradient (ones by default); any other x, None or zeros.
        # The invariant holds here too: an x the view finds unconnected while tf.gradients
        # differentiates it (through a path the view does not follow) takes tf.gradients.
        lost = lost_gradients(
            ys, xs, _identity_gradients(ys, xs, grad_ys, tf.UnconnectedGradients.NONE),
            grad_ys, stop_gradients)
        if lost is not None:
            return _fall_back(plain, mode, None, lost)
        _record(mode="unconnected")
        return _identity_gradients(ys, xs, grad_ys, unconnected)
    unsupported = unsupported_op(view)
    if unsupported is not None:
        return _fall_back(plain, mode, None, unsupported)
    try:
        plan = choose(view, strategy)
    except Exception as error:  # noqa: BLE001 - what the caller caused is raised again
        if not is_internal_failure(error, strategy):
            raise
        return _fall_back(plain, mode, None, crash_reason("planning", error))
    loops = any(op.type in LOOP_TYPES for op in view.ops)
    # Under a tape that records the ys (a gradient of this gradient), a loop's gradient goes
    # through memgrad's loop gradients even in a plain plan: the tape differentiates
    # TensorFlow's own (what plain tf.gradients builds) wrongly. A memgrad tape of this graph
    # differentiates the graph instead, as tf.gradients twice does, so it does not count.
    taped_loops = loops and recording.recorded_by_a_tape(ys, "a gradient through a loop")
    if not plan.tensors and not (loops and plan.loops == "segments") and not taped_loops:
        # A strategy whose answer is plain backprop (a budget plain backprop fits, 'speed'
        # finding plain's own set) says so in its plan.
        reason = ""
        if not plan.details.get("same_as_plain"):
            what = ("none of the tensors marked with memgrad.mark_checkpoint lies between xs and "
                    "ys" if plan.mode == "collection" else "found nothing worth keeping")
            reason = f"{what} in a graph of {len(view.ops)} forward ops"
            warnings.warn(
                f"memgrad.gradients(checkpoints={plan.mode!r}): {reason}; using plain "
                "tf.gradients for it.",
                stacklevel=2,
            )
        _record(mode=plan.mode, fallback=True, plan=plan, fallback_reason=reason)
        return _plain_gradients(plain)
    gradients_fn = functools.partial(
        TF_GRADIENTS_V1, unconnected_gradients="none", name="backprop")
    for _ in range(MAX_REFINEMENTS + 1):
        try:
            with tf.name_scope("memgrad_" + name.replace("gradients", "grad")):
                grads, rewrite = rewrite_gradients(
                    view, plan.tensors, grad_ys, gradients_fn, kwargs, stop_gradients,
                    loops=plan.loops,
                )
        except Exception as error:  # noqa: BLE001 - any failure of the rewrite falls back
            return _fall_back(plain, plan.mode, plan, crash_reason("building the rewrite", error))
        # The strategy may replace its plan once it sees the rewrite (a Budget measures its
        # peak; the rewrite just built is never run by the step: unneeded ops are pruned).
        # What it raises on purpose is the caller's to see (a budget no plan fits), not a
        # fallback; an internal failure of a built-in strategy is.
        try:
            following = _refined(strategy, view, plan, grads)
        except Exception as error:  # noqa: BLE001 - what the caller caused is raised again
            if not is_internal_failure(error, strategy):
                raise
            return _fall_back(plain, plan.mode, plan, crash_reason("refining the plan", error))
        if following is None:
            break
        plan = following
    else:
        raise RuntimeError(
            f"{type(strategy).__name__}.refine returned a new plan {MAX_REFINEMENTS} times "
            f"in a row; expected None (keep the plan) within {MAX_REFINEMENTS} rewrites.")
    lost = lost_gradients(ys, xs, grads, grad_ys, stop_gradients)
    if lost is not None:
        return _fall_back(plain, plan.mode, plan, lost)
    _record(
        copied_ops=rewrite.copied_ops, recomputed_ops=rewrite.recomputed_ops(),
        segments=rewrite.segments,
        gradient_seconds=rewrite.gradient_seconds, checkpoints=len(plan.tensors),
        mode=plan.mode, estimated_bytes=plan.estimated_bytes, plan=plan,
        loops=tuple(rewrite.loops.records),
    )
    if unconnected == tf.UnconnectedGradients.ZERO:
        grads = [
            tf.zeros_like(x) if g is None else g for g, x in zip(grads, xs)
        ]
    return grads


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
    _record(mode=mode, fallback=True, plan=plan, fallback_reason=reason)
    return _plain_gradients(plain)


@tf.autograph.experimental.do_not_convert
def mark_checkpoint(tensor):
    """Mark a tensor for `checkpoints='collection'` and return it unchanged.

    Inside a `tf.function` the tensor is added to the graph's `'checkpoints'` collection;
    in eager mode nothing is recorded (there is no graph to rewrite).

    Args:
      tensor: a tensor computed in the forward pass.

    Returns:
      The same tensor.

    Raises:
      TypeError: if ``tensor`` is not a `tf.Tensor` (a number, a NumPy array, a variable).

    Example:
      ```python
      h = memgrad.mark_checkpoint(block(h))
      ```
    """
    if not tf.is_tensor(tensor) or hasattr(tensor, "assign"):  # a variable is no forward tensor
        raise TypeError(
            "memgrad.mark_checkpoint marks a tensor computed in the forward pass; expected a "
            f"tf.Tensor. Received: {type(tensor).__name__} {tensor!r}"
        )
    if tf.is_symbolic_tensor(tensor):
        tensor.graph.add_to_collection(COLLECTION, tensor)
    return tensor
