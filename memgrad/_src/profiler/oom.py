"""What was alive when a step ran out of memory: `oom_report`, `explain_oom` and the
error that carries the report."""

from __future__ import annotations

import dataclasses
import functools
import gc
import re

import tensorflow as tf

from memgrad._src.profiler.live import (
    MemoryCategories, categorize, check_call, profiled_call, checked_variables)


@dataclasses.dataclass(frozen=True)
class OutOfMemoryReport:
    """What was alive when a step ran out of memory (`oom_report`, `explain_oom`).

    Attributes:
      device: the device that ran out.
      message: the first line of TensorFlow's error (the request that failed).
      memory: a `MemoryCategories` of the failed call at its highest usage before the failure:
        the tensors alive then (op, layer, shape, dtype, bytes) and the split by category.
    """

    device: str
    message: str
    memory: MemoryCategories

    @property
    def tensors(self) -> tuple:
        """The largest tensors alive at the failure, largest first (`LiveTensor`)."""
        return self.memory.tensors

    def as_dict(self) -> dict:
        return {"device": self.device, "message": self.message, "memory": self.memory.as_dict()}

    def __str__(self) -> str:
        return (f"out of memory on {self.device}: {self.message}\n"
                f"in use when it failed: {self.memory}")


class OutOfMemoryError(tf.errors.ResourceExhaustedError):
    """A ``ResourceExhaustedError`` that carries an `OutOfMemoryReport` (``.report``) in its
    message; ``except tf.errors.ResourceExhaustedError`` still catches it."""

    def __init__(self, report, error):
        message = f"{error.message}\n\nmemgrad: {report}"
        super().__init__(error.node_def, error.op, message)
        self.report = report


_OOM_REQUEST = re.compile(r"OOM when allocating tensor with shape\s*\[[^\]]*\] and type \w+")


_OOM_NODE = re.compile(r"\{\{node ([^}]+)\}\}")


def first_line(error) -> str:
    """The failed request (and the op that made it) from TensorFlow's error text, in one line."""
    text = str(getattr(error, "message", None) or error).strip()
    request, node = _OOM_REQUEST.search(text), _OOM_NODE.search(text)
    if request:
        return request.group(0) + (f" (op {node.group(1)})" if node else "")
    return text.splitlines()[0][:500] if text else type(error).__name__


def oom_report(fn, args=(), kwargs=None, *, k=10, device=None, weights=(), optimizer_variables=(),
               warmup=0):
    """Runs ``fn`` once under TensorFlow's profiler and, if it runs out of memory, reports what
    was alive then.

    TensorFlow 2's own ``report_tensor_allocations_upon_oom`` does not work in eager mode or
    ``tf.function``. This replays the allocator's events of the failed call to its highest
    usage (the failing request comes on top of that) and lists the buffers alive there, each
    with the op and layer that made it, and the split by category (`memory_by_category`).

    Args:
      fn: the step that runs out of memory. It is called ``warmup + 1`` times, so it must be
        safe to repeat (a training step that failed did not apply its update).
      args: positional arguments for ``fn``: a tuple or list, or a single tensor or array.
      kwargs: keyword arguments for ``fn``.
      k: how many of the largest buffers to list.
      device: ``'CPU:0'``, ``'GPU:0'``, ... or ``None`` for the first GPU if any, else the CPU.
      weights: the model's variables, to split the baseline and name the gradients.
      optimizer_variables: the optimizer's variables.
      warmup: calls made before the profiled one.

    Returns:
      An `OutOfMemoryReport`, or ``None`` if the call finished.

    Raises:
      TypeError, ValueError: for bad arguments, as `memory_by_category`.
      MemoryStatsUnavailableError: if the allocator keeps no statistics.

    Example:
      >>> report = oom_report(tf.function(lambda x: tf.reduce_sum(x)), tf.ones([8]), device="CPU:0")
      >>> report is None  # it fits
      True
    """
    args, kwargs, device = check_call(fn, args, kwargs, k, device, "oom_report")
    weights, optimizer_variables = checked_variables(weights, optimizer_variables)
    events, baseline, error = profiled_call(fn, args, kwargs, device, warmup, raise_oom=False)
    if error is None:
        return None
    memory = categorize(events, baseline, weights, optimizer_variables, device, k)
    return OutOfMemoryReport(device=device, message=first_line(error), memory=memory)


def explain_oom(fn=None, *, k=10, device=None, weights=(), optimizer_variables=()):
    """Decorates a step so that running out of memory says what was alive.

    The step runs as usual, at no cost. When it raises ``ResourceExhaustedError``, it is run
    once more under TensorFlow's profiler (`oom_report`), and an `OutOfMemoryError` (a
    ``ResourceExhaustedError``) is raised whose message and ``.report`` list the largest
    tensors alive at the failure with their layers, and the memory by category.

    Args:
      fn: the step (a function or ``tf.function``); it must be safe to run again after it
        failed. Without it, ``explain_oom(k=...)`` returns the decorator.
      k: how many tensors to list.
      device: the device the step runs on (``None``: the first GPU if any, else the CPU).
      weights, optimizer_variables: as for `memory_by_category` (optional; name the gradients
        and split what was allocated before the step).

    Returns:
      The decorated step.

    Example:
      >>> @explain_oom(k=5)
      ... @tf.function
      ... def step(x):
      ...     return tf.reduce_sum(tf.tanh(x))
      >>> float(step(tf.zeros([4])))
      0.0
    """
    if fn is None:
        return lambda f: explain_oom(f, k=k, device=device, weights=weights,
                                     optimizer_variables=optimizer_variables)
    if not callable(fn):
        raise TypeError(f"explain_oom expected a callable step. Received: {fn!r}")

    @functools.wraps(fn)
    def step(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except tf.errors.ResourceExhaustedError as error:
            if isinstance(error, OutOfMemoryError):
                raise
            failure = error
        gc.collect()  # the failed call's buffers, before it runs again
        report = oom_report(fn, args, kwargs, k=k, device=device, weights=weights,
                            optimizer_variables=optimizer_variables)
        if report is None:  # it fitted the second time: the first failure stands as it was
            raise failure
        raise OutOfMemoryError(report, failure) from failure

    return step
