"""`memgrad.gradients`, a drop-in for `tf.gradients`, and the monkey patch that installs it."""

import functools
import threading
import warnings

import tensorflow as tf
from tensorflow.python.ops import gradients_impl

from memgrad.checkpointing.rewrite import rewrite_gradients
from memgrad.checkpointing.strategies import COLLECTION, choose
from memgrad.graph.view import ForwardGraph

# TensorFlow's own functions, kept before any patch so memgrad never calls itself.
_TF_GRADIENTS_V1 = gradients_impl.gradients
_TF_GRADIENTS_V2 = gradients_impl.gradients_v2
_patch_lock = threading.Lock()
# Counters of the latest rewrite (copied ops, segments, seconds in tf.gradients), for
# benchmarks and tests.
_last_rewrite = {}
_patched = {}


def _as_list(value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _check_inputs(ys, xs, grad_ys):
    if tf.executing_eagerly():
        raise RuntimeError(
            "memgrad.gradients works inside a graph (a tf.function), like tf.gradients. "
            "Received a call in eager mode: wrap the training step in @tf.function, or use "
            "memgrad.GradientTape, which falls back to tf.GradientTape when eager."
        )
    if not ys:
        raise ValueError("memgrad.gradients needs at least one y. Received: ys=[]")
    if not xs:
        raise ValueError("memgrad.gradients needs at least one x. Received: xs=[]")
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
        if not is_tensor and not hasattr(x, "handle"):
            raise TypeError(
                "xs must be graph tensors or variables. Received: "
                f"{type(x).__name__} {x!r}"
            )
    if grad_ys is not None and len(grad_ys) != len(ys):
        raise ValueError(
            f"grad_ys must have one entry per y. Received {len(grad_ys)} for {len(ys)} ys."
        )


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
        `'speed'` (outputs of matrix products and convolutions), `'collection'` (tensors
        marked with `memgrad.checkpoint`), a list of tensors to keep, or
        `memgrad.Budget(bytes_or_fraction)`: the least recomputation whose predicted
        activation peak fits the budget.
      name: a name scope for the gradient ops.
      **kwargs: passed to `tf.gradients`: `gate_gradients`, `aggregation_method`,
        `stop_gradients`, `unconnected_gradients`, `colocate_gradients_with_ops`.

    Returns:
      A list with one gradient (a tensor, `tf.IndexedSlices`, or None) per x.

    Raises:
      RuntimeError: when called eagerly.
      ValueError: when no x is connected to any y, or a checkpoint is not a forward tensor.
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
    ys = _as_list(ys)
    xs = _as_list(xs)
    grad_ys = _as_list(grad_ys)
    _check_inputs(ys, xs, grad_ys)
    if grad_ys is None:
        grad_ys = [None] * len(ys)
    stop_gradients = _as_list(kwargs.pop("stop_gradients", None)) or []
    unconnected = kwargs.pop("unconnected_gradients", tf.UnconnectedGradients.NONE)
    unconnected = tf.UnconnectedGradients(unconnected)

    view = ForwardGraph(ys, xs)
    if not view.ops:
        raise ValueError(
            "None of xs is connected to ys: no op on a path from an x to a y. Received "
            f"ys={[y.name for y in ys]} and {len(xs)} xs."
        )
    plan = choose(view, checkpoints)
    if not plan.tensors:
        if plan.mode == "budget":  # plain backprop fits the budget: nothing to keep
            return _TF_GRADIENTS_V1(
                ys, xs, grad_ys=grad_ys, name=name, stop_gradients=stop_gradients or None,
                unconnected_gradients=unconnected, **kwargs,
            )
        warnings.warn(
            f"memgrad.gradients(checkpoints={plan.mode!r}) found nothing worth keeping in a "
            f"graph of {len(view.ops)} forward ops; using plain tf.gradients for it.",
            stacklevel=2,
        )
        return _TF_GRADIENTS_V1(
            ys, xs, grad_ys=grad_ys, name=name, stop_gradients=stop_gradients or None,
            unconnected_gradients=unconnected, **kwargs,
        )
    gradients_fn = functools.partial(
        _TF_GRADIENTS_V1, unconnected_gradients="none", name="backprop")
    with tf.name_scope("memgrad_" + name.replace("gradients", "grad")):
        grads, rewrite = rewrite_gradients(
            view, plan.tensors, grad_ys, gradients_fn, kwargs, stop_gradients
        )
        _last_rewrite.clear()
        _last_rewrite.update(
            copied_ops=rewrite.copied_ops, segments=rewrite.segments,
            gradient_seconds=rewrite.gradient_seconds, checkpoints=len(plan.tensors),
            mode=plan.mode, estimated_bytes=plan.estimated_bytes,
        )
        if unconnected == tf.UnconnectedGradients.ZERO:
            grads = [
                tf.zeros_like(x) if g is None else g for g, x in zip(grads, xs)
            ]
    return grads


@tf.autograph.experimental.do_not_convert
def checkpoint(tensor):
    """Mark a tensor for `checkpoints='collection'` and return it unchanged.

    Inside a `tf.function` the tensor is added to the graph's `'checkpoints'` collection;
    in eager mode nothing is recorded (there is no graph to rewrite).

    Args:
      tensor: a tensor computed in the forward pass.

    Returns:
      The same tensor.

    Example:
      ```python
      h = memgrad.checkpoint(block(h))
      ```
    """
    if tf.is_symbolic_tensor(tensor):
        tensor.graph.add_to_collection(COLLECTION, tensor)
    return tensor


def monkey_patch(checkpoints="memory"):
    """Replace `tf.gradients` and `tf.compat.v1.gradients` with checkpointed versions.

    Code written for `tf.gradients` then saves memory unchanged. `memgrad.unpatch()`
    restores TensorFlow's functions. Code that imported the function itself before the
    patch (`from tensorflow import gradients`) keeps the original.

    Args:
      checkpoints: the strategy every patched call uses (see `memgrad.gradients`).

    Returns:
      None.

    Example:
      ```python
      memgrad.monkey_patch(checkpoints="memory")
      grads = tf.gradients(loss, variables)   # now checkpointed
      memgrad.unpatch()
      ```
    """
    # One function serves both names: the v1 keywords (colocate_gradients_with_ops, ...)
    # pass through **kwargs to tf.gradients.
    def patched(ys, xs, grad_ys=None, name="gradients", **kwargs):
        return gradients(ys, xs, grad_ys=grad_ys, checkpoints=checkpoints, name=name, **kwargs)

    with _patch_lock:
        if not _patched:
            _patched["v2"] = tf.gradients
            _patched["v1"] = tf.compat.v1.gradients
        tf.gradients = patched
        tf.compat.v1.gradients = patched


def unpatch():
    """Restore TensorFlow's `tf.gradients` and `tf.compat.v1.gradients`.

    Returns:
      None.
    """
    with _patch_lock:
        if _patched:
            tf.gradients = _patched.pop("v2")
            tf.compat.v1.gradients = _patched.pop("v1")
