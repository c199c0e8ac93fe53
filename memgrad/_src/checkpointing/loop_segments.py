"""How long a loop's segments are: its number of steps, the bytes of its state and of each
step's intermediates, and the segment length that keeps the least."""

import math

import tensorflow as tf


def static_int(tensor):
    """The value of a scalar integer tensor known at trace time (a constant, or the max/min
    of one, as Keras's RNN gives its loop), or None."""
    value = tf.get_static_value(tensor)
    op = tensor.op
    if value is None and op.type in ("Max", "Min") and len(op.inputs) == 2:
        data, axis = (tf.get_static_value(t) for t in op.inputs)
        if data is not None and axis is not None:
            reduce = data.max if op.type == "Max" else data.min
            value = reduce(axis=tuple(int(a) for a in tf.nest.flatten(axis.tolist())))
    if value is None or getattr(value, "ndim", 0) != 0:
        return None
    return int(value)


def steps_estimate(op):
    """A likely number of steps for a loop with no static bound: the length of a list it
    reads or writes (a TensorArray's size), else 1024. Only the segment length depends on it."""
    lengths = []
    for t in op.inputs:
        if t.op.type == "TensorListReserve":
            lengths.append(static_int(t.op.inputs[1]))
        elif t.op.type == "TensorListFromTensor":
            lengths.append(t.op.inputs[0].shape[0] if t.op.inputs[0].shape.rank else None)
    lengths = [n for n in lengths if n]
    return max(lengths) if lengths else 1024


def segment_length(steps, state_bytes=0, step_bytes=0):
    """Steps per segment: the k minimising the kept states (steps / k of ``state_bytes``)
    plus one replayed segment's intermediates (k of ``step_bytes``), k = sqrt(steps *
    state_bytes / step_bytes). A loop whose state is small beside what one step keeps for its
    gradient (an RNN: h and c against every gate) gets shorter segments; k stays at least
    half of sqrt(steps), since every segment costs a loop launch in the backward. Without
    sizes, k = ceil(sqrt(steps))."""
    root = math.isqrt(max(steps - 1, 0)) + 1
    if state_bytes <= 0 or step_bytes <= 0:
        return max(1, root)
    best = round(math.sqrt(steps * state_bytes / step_bytes))
    return max(1, min(steps, max(best, (root + 1) // 2)))


def dividing_segment_length(steps, state_bytes=0, step_bytes=0):
    """The divisor of ``steps`` nearest (in the memory it keeps) to `segment_length`'s
    choice, or None when no divisor keeps under twice what that choice keeps."""
    target = segment_length(steps, state_bytes, step_bytes)
    state, step = (state_bytes, step_bytes) if state_bytes > 0 and step_bytes > 0 else (1, 1)

    def kept(k):
        return steps / k * state + k * step

    shortest = (math.isqrt(max(steps - 1, 0)) + 2) // 2 if state_bytes > 0 else 1
    divisors = [d for d in range(max(1, shortest), steps + 1) if steps % d == 0]
    best = min(divisors, key=lambda d: (kept(d), d))
    if kept(best) > 2 * kept(target):
        return None
    return best


def _static_bytes(tensors):
    """Bytes of the tensors whose shapes are fully known; None if any is not."""
    total = 0
    for t in tensors:
        if t.dtype == tf.variant or t.dtype == tf.resource:
            continue
        if not t.shape.is_fully_defined():
            return None
        total += t.shape.num_elements() * t.dtype.size
    return total


_NOT_KEPT_PER_STEP = frozenset({
    "Const", "Identity", "Placeholder", "NoOp", "Shape", "Size", "Rank", "StopGradient",
    "TensorListGetItem", "TensorListSetItem", "TensorListPushBack", "TensorListPopBack",
    "TensorListElementShape", "TensorListLength"})


def loop_sizes(body, kinds):
    """``(state_bytes, step_bytes)``: the loop's carried state and the outputs of one step's
    ops (what its gradient may keep per step), 0 where a shape is not static."""
    state = _static_bytes(body.inputs[i] for i, kind in enumerate(kinds) if kind == "state")
    step = 0
    for o in body.get_operations():
        if o.type in _NOT_KEPT_PER_STEP:
            continue
        size = _static_bytes(t for t in o.outputs if t.dtype.is_floating)
        if size is None:
            return 0, 0
        step += size
    return state or 0, step
