"""The log of what each `memgrad.gradients` call did: `RewriteRecord`, `record_rewrites`."""

import contextlib
import dataclasses
import threading

import tensorflow as tf

_recorders = []  # the lists of every active record_rewrites() block (any thread)
_recorders_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RewriteRecord:
    """What one `memgrad.gradients` call did, as logged by `record_rewrites`.

    Attributes:
      mode: the strategy's name (``'memory'``, ``'speed'``, ``'collection'``, ``'list'``,
        ``'budget'``, a user strategy's ``name``), or ``'unconnected'``.
      segments: segments of the forward pass differentiated separately (0: no rewrite).
      in_place_segments: of those, the segments whose gradients read only kept tensors:
        differentiated on the original ops, with nothing copied or recomputed.
      copied_ops: forward ops copied for recomputation.
      recomputed_ops: the copies that run: those the gradients depend on. TensorFlow prunes
        the rest before the step runs (a copied matrix product whose gradient reads only its
        inputs, a copy read only by gradient ops no x's gradient needs).
      recomputed_flops: the floating-point operations of the copies that run (from static
        shapes, as `memgrad.analyze` counts them): what the rewrite adds to the step.
        `memgrad.analyze` predicts it from the memory model.
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
    in_place_segments: int = 0
    recomputed_flops: float = 0.0


def copies_that_run(copies, grads):
    """The ops among ``copies`` that ``grads`` depend on, through data or control edges:
    those that run once TensorFlow prunes the step (not a copied MatMul whose gradient reads
    only its inputs, nor a copy read only by gradient ops that no x's gradient needs)."""
    copies, seen, running = set(copies), set(), []
    stack = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            stack += [g.values.op, g.indices.op]
        elif g is not None:
            stack.append(g.op)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op in copies:
            running.append(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return running


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


def rewrites_recorded():
    """Whether a `record_rewrites` block is active (what only the log needs can be skipped)."""
    return bool(_recorders)


def record(**fields):
    """Adds one `RewriteRecord` to every active `record_rewrites` log."""
    if not _recorders:
        return
    entry = RewriteRecord(**fields)
    with _recorders_lock:
        for log in _recorders:
            log.append(entry)


def record_fallback(mode, reason):
    """Notes, for `record_rewrites`, a gradient memgrad left to TensorFlow (``reason``)."""
    record(mode=mode, fallback=True, fallback_reason=reason)
