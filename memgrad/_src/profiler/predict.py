"""Predicted peak memory of a traced step, without running it: "will it fit?".

`predict_peak` traces the step (a `tf.function`, or a Python function it wraps) for the given
argument shapes, hands the graph to Grappler, TensorFlow's graph optimizer, with the rewrites
TensorFlow itself applies before running a function (pruning, constant folding, arithmetic
simplification, op fusion), and asks Grappler's virtual cluster to simulate the optimized
graph's execution. The simulation allocates every op's outputs from their static shapes,
frees each tensor after its last consumer, and reports the peak. Nothing runs on a device and
no activation is allocated: arguments may be `tf.TensorSpec`s.

`predict_max_batch_size` searches the largest batch whose predicted peak fits a byte limit,
with one trace per probe.

Kernels' scratch buffers, which the graph does not show (Eigen's convolutions without oneDNN,
oneDNN's primitives, the temporary buffers of XLA-compiled functions such as ConvNeXt's grouped
convolutions on CPU), are measured by running each distinct such op once alone
(`memgrad._src.graph.kernels`). The allocator's rounding and the executor's own order of ops
are not modelled.
"""

import dataclasses
import time

import tensorflow as tf

from memgrad._src.arguments import positional_args
from memgrad._src.allocator import statistics_available
from memgrad._src.graph.kernels import compiled_functions
from memgrad._src.graph.simulate import simulate_peak
from memgrad._src.profiler.measure import resolve_device
from memgrad._src.profiler.search import check_search_arguments, largest_fitting
from memgrad._src.units import format_bytes, parse_bytes

@dataclasses.dataclass(frozen=True)
class PeakPrediction:
    """A step's predicted peak memory.

    Attributes:
      peak_bytes: everything the step's graph holds at its predicted peak, its variables and
        inputs included.
      variable_bytes: the variables the step reads or writes (weights, optimizer state).
      input_bytes: the step's tensor arguments.
      seconds: how long tracing, optimizing and simulating took.
      notes: what the prediction leaves out for this graph (e.g. XLA-compiled calls).
    """

    peak_bytes: int
    variable_bytes: int
    input_bytes: int
    seconds: float
    notes: tuple = ()

    @property
    def peak_above_baseline_bytes(self) -> int:
        """The predicted peak less the variables and inputs: what
        `memgrad.profiler.measure(step).peak_above_baseline_bytes` measures for the step."""
        return max(self.peak_bytes - self.variable_bytes - self.input_bytes, 0)

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), peak_above_baseline_bytes=self.peak_above_baseline_bytes)

    def __str__(self):
        text = (f"predicted peak {format_bytes(self.peak_bytes)}: "
                f"{format_bytes(self.peak_above_baseline_bytes)} above "
                f"{format_bytes(self.variable_bytes)} of variables and "
                f"{format_bytes(self.input_bytes)} of inputs ({self.seconds:.1f} s)")
        return "\n".join([text] + [f"  note: {note}" for note in self.notes])


def _concrete_function(fn, args, kwargs):
    if hasattr(fn, "graph") and hasattr(fn, "structured_outputs"):
        if args or kwargs:
            raise TypeError("predict_peak takes no arguments with a concrete function (it is "
                            f"already traced). Received: args={args!r}, kwargs={kwargs!r}")
        return fn
    if not callable(fn):
        raise TypeError("predict_peak expects a tf.function, a concrete function or a Python "
                        f"function. Received: {type(fn).__name__} {fn!r}")
    if not hasattr(fn, "get_concrete_function"):
        fn = tf.function(fn)
    return fn.get_concrete_function(*args, **kwargs)


def _notes(graph, measured):
    """What the simulation leaves out for this graph (``measured``: kernels' scratch is)."""
    notes = []
    xla = 0
    for op in graph.get_operations():
        attrs = op.node_def.attr
        if ("_XlaMustCompile" in attrs and attrs["_XlaMustCompile"].b) or (
                "_xla_compile_id" in attrs):
            xla += 1
    compiled = compiled_functions(graph.as_graph_def().library)
    if xla or compiled:
        if measured:
            notes.append(
                f"{max(xla, len(compiled))} XLA-compiled function(s): each one's temporary "
                "buffer was measured by running it alone (calls it makes inside another "
                "compiled function are not)")
        else:
            notes.append(
                f"{max(xla, len(compiled))} XLA-compiled function(s): their temporary buffers "
                "are not predicted (XLA plans them when it compiles)")
    return tuple(notes)


@tf.autograph.experimental.do_not_convert
def predict_peak(fn, args=(), kwargs=None, *, optimize=True, scratch=True,
                 device=None) -> PeakPrediction:
    """Predicts the peak memory of one call of ``fn`` without running it.

    ``fn`` is traced for ``args`` (tensors, arrays or `tf.TensorSpec`s: nothing is
    allocated for them), the graph is optimized by Grappler as TensorFlow does before running
    a function, and Grappler's virtual cluster simulates its execution: each op's outputs
    are allocated from their static shapes and freed after their last consumer.

    It sees what the step's graph does: activations kept for backprop, gradients, the
    weights' gradients held until the optimizer applies them, a memgrad checkpointing
    rewrite, custom gradients. Kernels' scratch buffers, which no graph shows, are measured
    (``scratch=True``): each distinct convolution and XLA-compiled call of the optimized
    graph runs once, alone, on zeros of its input shapes, on ``device``, and its
    allocation above its inputs and outputs is held while that op runs in the simulation.
    That costs about a second on keras.applications models and the memory of the largest
    such op; it is not a run of the step. Left out: the allocator's rounding, the
    executor's own order of ops (it may run several at once), and scratch of other ops.
    Shapes must be static.

    Args:
      fn: a `tf.function` (e.g. a training step), a Python function (wrapped in one), or a
        concrete function (then no ``args``).
      args: positional arguments for tracing: a tuple or list, or one tensor, array or
        `tf.TensorSpec` standing for the one argument.
      kwargs: keyword arguments for tracing.
      optimize: run Grappler's optimizations first, as TensorFlow does at run time.
      scratch: measure kernels' scratch buffers as above; ``False`` runs nothing at all.
      device: where kernels' scratch is measured (``'CPU:0'``, ``'GPU:0'``; default: the
        first GPU if any, else the CPU). Its allocator must keep statistics (a GPU's, or the
        CPU's BFC allocator, which importing memgrad selects); otherwise scratch is left out
        and ``notes`` says so.

    Returns:
      A `PeakPrediction`; ``peak_above_baseline_bytes`` is comparable to
      `memgrad.profiler.measure`'s figure of the same name.

    Raises:
      TypeError: for something that is not a function, or bad ``args``/``kwargs``.

    Example:
      >>> import keras, tensorflow as tf, memgrad
      >>> model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(256)])
      >>> @tf.function
      ... def step(x):
      ...     with tf.GradientTape() as tape:
      ...         loss = tf.reduce_sum(model(x) ** 2)
      ...     return tape.gradient(loss, model.trainable_variables)
      >>> p = memgrad.profiler.predict_peak(step, tf.TensorSpec([1024, 256]))
      >>> p.peak_above_baseline_bytes > 1024 * 256 * 4
      True
    """
    start = time.perf_counter()
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"Expected kwargs to be a dict of keyword arguments. Received: {kwargs!r}")
    args = positional_args(args) if not isinstance(args, tf.TensorSpec) else (args,)
    concrete = _concrete_function(fn, args, dict(kwargs or {}))
    graph = concrete.graph
    kernels, unmeasured = None, ()
    if scratch:
        kernels = resolve_device(device)
        if not statistics_available(kernels):
            unmeasured = (f"kernels' scratch buffers are not measured: {kernels} keeps no memory "
                          "statistics (set TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts)",)
            kernels = None
    notes = _notes(graph, kernels is not None) + unmeasured
    simulated = simulate_peak(graph, [*graph.outputs, *graph.control_outputs], optimize=optimize,
                              kernels=kernels)
    return PeakPrediction(peak_bytes=simulated.peak_bytes, variable_bytes=simulated.variable_bytes,
                          input_bytes=simulated.input_bytes, seconds=time.perf_counter() - start,
                          notes=notes)


@dataclasses.dataclass(frozen=True)
class BatchPrediction:
    """The largest batch whose predicted peak fits a limit.

    Attributes:
      batch_size: the largest batch size predicted to fit (0 if even ``low`` does not).
      limit_bytes: the limit.
      predicted_bytes: the predicted peak (`PeakPrediction.peak_bytes` plus the overhead)
        at that batch size.
      probes: ``(batch_size, predicted_bytes)`` of every batch size traced, in order.
    """

    batch_size: int
    limit_bytes: int
    predicted_bytes: int
    probes: tuple


def predict_max_batch_size(build, limit, *, low=1, high=4096, start=None, rtol=0.0, overhead_bytes=0,
                           optimize=True, scratch=True, device=None) -> BatchPrediction:
    """Predicts the largest batch size whose step fits under ``limit`` bytes, without
    running a step: each probe traces ``build(batch_size)`` and calls `predict_peak`.

    The search grows the batch, aiming past where a line through the predicted peaks meets
    the limit (activations grow linearly with the batch), then interpolates between the
    largest size that fits and the smallest that does not, bisecting when interpolation
    stalls: a handful of traces (the search `max_batch_size` uses).

    Args:
      build: ``build(batch_size)`` returning ``(fn, args)`` or ``(fn, args, kwargs)`` for
        `predict_peak`, e.g. the training step and `tf.TensorSpec`s of a batch.
      limit: the device's memory, in bytes or as a string such as ``'4GiB'``.
      low: the smallest batch size considered.
      high: the largest batch size considered.
      start: an optional first guess in ``[low, high]`` (default ``low``): a guess near the
        answer saves traces.
      rtol: stop once the smallest size predicted not to fit is within ``rtol`` of the
        largest that fits (``0``: the exact largest). A prediction is within about 10-15% of
        the measured peak, so ``rtol=0.05`` loses nothing real and saves a few traces.
      overhead_bytes: bytes the device holds besides the step's graph (the runtime's own
        buffers, other models), added to each prediction.
      optimize, scratch, device: passed to `predict_peak` (``scratch`` runs each distinct
        convolution once alone per probe, at that batch size).

    Returns:
      A `BatchPrediction`.

    Raises:
      ValueError: for bad bounds or limit, or a ``build`` that does not return
        ``(fn, args)`` or ``(fn, args, kwargs)``.

    Example:
      ```python
      def build(batch_size):
          return train_step, (tf.TensorSpec([batch_size, 224, 224, 3]), tf.TensorSpec([batch_size], tf.int32))
      print(memgrad.profiler.predict_max_batch_size(build, "8GiB", high=1024, rtol=0.05).batch_size)
      ```
    """
    check_search_arguments(low, high, start, rtol)
    limit_bytes = int(parse_bytes(limit))
    if limit_bytes <= 0:
        raise ValueError(f"Expected a positive limit. Received: {limit!r}")
    predicted = {}

    def peak(batch):
        if batch not in predicted:
            built = build(batch)
            if not isinstance(built, tuple) or len(built) not in (2, 3):
                raise ValueError("predict_max_batch_size expects build(batch_size) to return "
                                 f"(fn, args) or (fn, args, kwargs). Received: {built!r}")
            fn, args, *rest = built
            prediction = predict_peak(fn, args, rest[0] if rest else None, optimize=optimize,
                                      scratch=scratch, device=device)
            predicted[batch] = prediction.peak_bytes + int(overhead_bytes)
        return predicted[batch]

    def fits(batch):
        predicted_bytes = peak(batch)
        return predicted_bytes <= limit_bytes, predicted_bytes

    batch = largest_fitting(fits, low, high, limit_bytes, start=start, rtol=rtol)
    return BatchPrediction(batch, limit_bytes, predicted.get(batch, 0), tuple(predicted.items()))
