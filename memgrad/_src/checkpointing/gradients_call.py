"""One `memgrad.gradients` call's arguments: checked against what `tf.gradients` accepts, with
clear errors, and held in the forms the steps of the call read."""

import dataclasses

import numpy as np
import tensorflow as tf

from memgrad._src.checkpointing.strategies import as_strategy


@dataclasses.dataclass(frozen=True)
class GradientsCall:
    """The checked arguments of one `memgrad.gradients` call.

    Attributes:
      ys, xs: lists of tensors (xs may hold variables).
      grad_ys: one incoming gradient per y (None: ones).
      strategy: the checkpoint strategy ``checkpoints`` named.
      name: the name scope of the gradient ops.
      kwargs: the rest of `tf.gradients`' arguments (gate_gradients, aggregation_method,
        colocate_gradients_with_ops).
      stop_gradients: a list of tensors.
      unconnected: a `tf.UnconnectedGradients`.
    """

    ys: list
    xs: list
    grad_ys: list
    strategy: object
    name: str
    kwargs: dict
    stop_gradients: list
    unconnected: tf.UnconnectedGradients

    @property
    def mode(self):
        """The strategy's name, as records and warnings show it."""
        return getattr(self.strategy, "name", "strategy")


def checked_call(ys, xs, grad_ys, checkpoints, name, kwargs):
    """A `GradientsCall`, or the error `tf.gradients` would raise, in words."""
    check_not_none(ys, xs)
    strategy = as_strategy(checkpoints)  # an unknown strategy fails here, whatever the graph
    ys, xs, grad_ys = as_list(ys) or [], as_list(xs) or [], as_list(grad_ys)
    check_inputs(ys, xs, grad_ys)
    kwargs = dict(kwargs)
    stop_gradients = as_list(kwargs.pop("stop_gradients", None)) or []
    unconnected = tf.UnconnectedGradients(kwargs.pop("unconnected_gradients", tf.UnconnectedGradients.NONE))
    return GradientsCall(ys, xs, grad_ys or [None] * len(ys), strategy, name, kwargs, stop_gradients,
                         unconnected)


def as_list(value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def check_not_none(ys, xs):
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


def check_inputs(ys, xs, grad_ys):
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
