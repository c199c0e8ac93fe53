"""`largest_live_tensors(fn)`: the tensors alive at the peak of one call, from TensorFlow's profiler.

TensorFlow's profiler records every allocation and deallocation of the device's allocator
(with the op that asked for it, the tensor's shape and dtype) when the allocator keeps
statistics (BFC on CPU, always on GPU). Replaying those events in time order gives the set of
buffers alive when the allocator's usage was highest: what a user should checkpoint.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import glob
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.names import BACKWARD_SCOPES, layer_of
from memgrad._src.profiler.measure import memory_info, sync_devices, prepare_call
from memgrad._src.units import format_bytes


@dataclasses.dataclass(frozen=True)
class LiveTensor:
    """One buffer alive at the peak.

    Attributes:
      op: the name of the op that allocated it (``'?'`` if the profiler did not say).
      shape: the tensor's shape as TensorFlow printed it, e.g. ``'[512,256]'``.
      dtype: the dtype's name, e.g. ``'float32'`` (``'?'`` if unknown).
      bytes: the bytes requested for it.
      layer: the name scope of ``op`` without its op names, e.g. ``'sequential/dense_1'``
        for ``'gradient_tape/sequential/dense_1/MatMul/MatMul_1'`` (``''`` if none).
      category: what it is (`CATEGORIES`): ``'activations'`` (made by the forward pass and
        kept for backprop), ``'gradients'`` (the weights' gradients), or ``'temporaries'``
        (a kernel's scratch space, the gradients of activations, the optimizer's arithmetic).
    """

    op: str
    shape: str
    dtype: str
    bytes: int
    layer: str = ""
    category: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """One line of a report: size, dtype, shape, layer (or op), and category if known."""
        where = self.layer or self.op
        return f"  {format_bytes(self.bytes):>11}  {self.dtype:<9} {self.shape:<20} {where}" + (
            f"  [{self.category}]" if self.category else "")


@dataclasses.dataclass(frozen=True)
class PeakTensors:
    """The result of `largest_live_tensors`.

    Attributes:
      peak_bytes: the allocator's usage at the peak of the call, as the profiler saw it.
      tensors: the largest buffers allocated during the call and alive at that peak, largest first.
      other_bytes: the rest of the usage at the peak (smaller buffers, and buffers allocated
        before the call, such as the weights and inputs).
      baseline_bytes: the allocator's usage just before the call (weights, inputs, ...).
      requested_peak_bytes: the most bytes above the baseline at any moment, each buffer
        counted at its requested size (the call's own buffers alive, less the buffers from
        before the call it released by then, such as a variable's old storage), without
        what the allocator adds: its rounding, and the free chunk it hands out whole when
        that chunk is less than twice the request (BFC). That chunk depends on what was
        freed before, so the allocator's peak moves from call to call even in the same
        order of ops (a two-block GPT-2 step, one inter-op thread: 4.60-5.19 MiB over
        ninety calls in eighteen processes, 4.58 requested in every one); this figure
        does not.
    """

    peak_bytes: int
    tensors: tuple
    other_bytes: int
    baseline_bytes: int = 0
    requested_peak_bytes: int = 0

    @property
    def peak_above_baseline_bytes(self) -> int:
        """What the call added at its peak: the figure `measure` and ``memgrad-profile``'s table show."""
        return max(self.peak_bytes - self.baseline_bytes, 0)

    def __str__(self) -> str:
        lines = [f"peak {format_bytes(self.peak_above_baseline_bytes)} above the "
                 f"{format_bytes(self.baseline_bytes)} held before the step; largest tensors alive at the peak:"]
        lines += [str(t) for t in self.tensors]
        lines.append(f"  {format_bytes(self.other_bytes):>11}  everything else (weights, inputs, smaller tensors)")
        return "\n".join(lines)


# What a step's peak memory holds, in the order `MemoryCategories` reports it.
CATEGORIES = ("weights", "optimizer", "inputs_and_other", "activations", "gradients", "temporaries")


@dataclasses.dataclass(frozen=True)
class MemoryCategories:
    """A step's peak memory by what it holds (`memory_by_category`).

    Every figure is in bytes at the moment of the peak. The first three were allocated before
    the step; the last three by the step itself, each buffer counted at the size the allocator
    gave it.

    Attributes:
      device: the device measured.
      peak_bytes: the allocator's usage at the peak.
      baseline_bytes: its usage just before the step.
      weights: the model's weights (the ``weights`` passed in).
      optimizer: the optimizer's state (the ``optimizer_variables`` passed in).
      inputs_and_other: the rest of what was allocated before the step and is still held at
        the peak (inputs, anything else the caller holds).
      activations: buffers the forward pass made that are alive at the peak (kept for backprop,
        or recomputed by a checkpointing strategy).
      gradients: the weights' gradients alive at the peak (backward buffers shaped like a
        trainable weight).
      temporaries: every other buffer the step allocated and holds at the peak (gradients of
        activations, kernels' scratch space, the optimizer's arithmetic).
      tensors: the largest buffers alive at the peak (`LiveTensor`, with layer and category).
    """

    device: str
    peak_bytes: int
    baseline_bytes: int
    weights: int
    optimizer: int
    inputs_and_other: int
    activations: int
    gradients: int
    temporaries: int
    tensors: tuple = ()

    @property
    def total_bytes(self) -> int:
        """The categories' sum (equals ``peak_bytes`` up to buffers the profiler missed)."""
        return sum(getattr(self, name) for name in CATEGORIES)

    def as_dict(self) -> dict:
        """Categories in bytes, the peak, and the listed tensors (JSON-serialisable)."""
        out = {name: getattr(self, name) for name in CATEGORIES}
        out.update(device=self.device, peak_bytes=self.peak_bytes, baseline_bytes=self.baseline_bytes,
                   tensors=[t.as_dict() for t in self.tensors])
        return out

    def __str__(self) -> str:
        lines = [f"peak {format_bytes(self.peak_bytes)} on {self.device}, by category:"]
        for name in CATEGORIES:
            value = getattr(self, name)
            share = value / self.peak_bytes if self.peak_bytes else 0.0
            lines.append(f"  {name.replace('_', ' '):<17} {format_bytes(value):>11}  {share:6.1%}")
        if self.tensors:
            lines.append("largest tensors alive at the peak:")
            lines += [str(t) for t in self.tensors]
        return "\n".join(lines)


def _stat_value(stat, names):
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return names.get(stat.ref_value)
    return getattr(stat, kind) if kind else None


def _allocation_events(space, device):
    """(time_ps, kind, stats) of ``device``'s allocator events in an XSpace, sorted by time.

    On GPU that is the ``GPU_0_bfc`` allocator; on CPU every allocator but the GPU's pinned
    host memory (``gpu_host_bfc``).
    """
    def wanted(allocator):
        allocator = str(allocator).lower()
        if device.startswith("GPU"):
            return f"gpu_{device.split(':')[1]}" in allocator
        return "gpu_host" not in allocator

    events = []
    for plane in space.planes:
        event_names = {key: meta.name for key, meta in plane.event_metadata.items()}
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                kind = event_names.get(event.metadata_id)
                if kind not in ("MemoryAllocation", "MemoryDeallocation"):
                    continue
                stats = {stat_names.get(s.metadata_id): _stat_value(s, stat_names) for s in event.stats}
                if wanted(stats.get("allocator_name", "")):
                    events.append((line.timestamp_ns * 1000 + event.offset_ps, kind, stats))
    events.sort(key=lambda item: item[0])
    return events


def _dtype_name(value):
    try:
        return tf.dtypes.as_dtype(int(value)).name
    except (TypeError, ValueError):
        return "?"


def _is_backward(op: str) -> bool:
    """Made by a gradient computation (recomputed forward ops of checkpointing count as forward)."""
    parts = str(op).split("/")[:-1]
    return any(p in BACKWARD_SCOPES for p in parts) and not any(p.startswith("recompute") for p in parts)


def _replay_live(events):
    """Replays time-ordered allocation events to the moment of highest usage.

    Returns:
      ``(usage at the peak, [(LiveTensor, allocated bytes)] allocated during the events and
      alive then, the sizes of the buffers allocated before the events and released before the
      peak, and the entries alive at the peak that outlive the events)``. A buffer that
      outlives the call and takes the place of one released before the peak is most often a
      variable's new storage (an assignment that reused its value's buffer and freed the old
      one).
    """
    live, released = {}, []
    peak_usage, peak_live, peak_released = -1, {}, []
    for _, kind, stats in events:
        address = stats.get("addr")
        if kind == "MemoryAllocation":
            requested = int(stats.get("requested_bytes") or 0)
            tensor = LiveTensor(
                op=str(stats.get("tf_op") or "?"), shape=str(stats.get("shape") or "?"),
                dtype=_dtype_name(stats.get("data_type")), bytes=requested)
            # A kernel's scratch space ("temp", e.g. a convolution's im2col buffer) is never kept.
            if stats.get("region_type") == "temp":
                tensor = dataclasses.replace(tensor, category="temporaries")
            live[address] = (tensor, int(stats.get("allocation_bytes") or requested))
        elif live.pop(address, None) is None:  # a buffer from before the call (an input, the last step's)
            released.append(int(stats.get("allocation_bytes") or 0))
        usage = int(stats.get("bytes_allocated") or 0)
        if usage > peak_usage:
            peak_usage, peak_live, peak_released = usage, dict(live), list(released)
    survivors = [peak_live[a] for a in peak_live if a in live and live[a] is peak_live[a]]
    return max(peak_usage, 0), list(peak_live.values()), peak_released, survivors


def _adopted(released, survivors):
    """The buffers alive at the peak that replaced, byte for byte, a buffer from before the call
    released before the peak: a variable's storage moved, counted once among the weights or the
    optimizer's state. Returns their ``id``s and the released bytes they account for."""
    sizes = collections.Counter(released)
    adopted, bytes_ = set(), 0
    for entry in survivors:
        if sizes[entry[1]] > 0:
            sizes[entry[1]] -= 1
            adopted.add(id(entry))
            bytes_ += entry[1]
    return adopted, bytes_


def requested_peak(events):
    """The most bytes above the call's baseline, counted at their requested sizes: what the
    call's own buffers asked for and were alive together, less the buffers from before the
    call that it released by then (the allocator's rounding and chunk fitting left out).

    The credit matters wherever a step assigns new storage to its variables: Keras's
    ``assign_sub`` on a variable computes ``v - delta`` into a new buffer and frees the old
    one, so without it a step that applies its gradients as they are made counts every
    updated weight twice by the end of its backward (a 6-layer GPT-2: 42 MiB of weights,
    a requested peak of 73.6 MiB where 64.5 were above the baseline).
    """
    live, usage, peak = {}, 0, 0
    for _, kind, stats in events:
        address = stats.get("addr")
        if kind == "MemoryAllocation":
            usage -= live.get(address, 0)  # an address reused without its release recorded
            live[address] = int(stats.get("requested_bytes") or 0)
            usage += live[address]
            peak = max(peak, usage)
        elif address in live:
            usage -= live.pop(address)
        else:  # a buffer from before the events (a variable's old storage, an input)
            usage -= int(stats.get("requested_bytes") or stats.get("allocation_bytes") or 0)
    return peak


def replay(events, k):
    """The `PeakTensors` of allocation events (``(time, kind, stats)``, time-ordered)."""
    peak_usage, alive, _, _ = _replay_live(events)
    tensors = sorted((t for t, _ in alive), key=lambda t: t.bytes, reverse=True)[:k]
    tensors = tuple(dataclasses.replace(t, layer=layer_of(t.op)) for t in tensors)
    return PeakTensors(peak_bytes=peak_usage, tensors=tensors,
                       other_bytes=max(peak_usage - sum(t.bytes for t in tensors), 0),
                       requested_peak_bytes=requested_peak(events))


def profiled_call(fn, args, kwargs, device, warmup, raise_oom=True):
    """Runs ``fn`` ``warmup`` times, then once under TensorFlow's profiler.

    Returns:
      ``(events, baseline_bytes, error)``: the device's allocation events of the profiled call,
      the allocator's usage just before it, and the ``ResourceExhaustedError`` it raised
      (``None`` if it finished; with ``raise_oom`` the error propagates instead).
    """
    xplane_pb2 = tf_internals.xplane_pb2()
    logdir = tempfile.mkdtemp(prefix="memgrad-live-")
    error = None
    try:
        with tf.device(device):
            for _ in range(warmup):
                fn(*args, **kwargs)
            sync_devices()
            gc.collect()
            baseline = int(memory_info(device)["current"])
            tf.profiler.experimental.start(logdir)
            try:
                fn(*args, **kwargs)
                sync_devices()
            except tf.errors.ResourceExhaustedError as oom:
                if raise_oom:
                    raise
                error = oom
            finally:
                tf.profiler.experimental.stop()
        paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        space = xplane_pb2.XSpace()
        for path in paths:
            with open(path, "rb") as handle:
                space.MergeFromString(handle.read())
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    events = _allocation_events(space, device)
    if not events:
        raise RuntimeError(
            f"TensorFlow's profiler recorded no allocation on {device} (is another profiler session "
            "running, or does the allocator keep no statistics?)")
    return events, baseline, error


def check_call(fn, args, kwargs, k, device, name):
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"Expected k to be an int >= 1. Received: {k!r}")
    return prepare_call(fn, args, kwargs, device, name)


def largest_live_tensors(fn, args=(), kwargs=None, *, k=10, device=None, warmup=1) -> PeakTensors:
    """Profiles one call of ``fn`` and returns the ``k`` largest tensors alive at its peak.

    The call is warmed up first (tracing a ``tf.function``), then run once under
    TensorFlow's profiler; the allocator's events are replayed to find the moment of
    highest usage and the buffers alive then. Buffers that existed before the call
    (weights, inputs) are counted in ``other_bytes``, not listed.

    Args:
      fn: the callable, e.g. a ``tf.function`` training step.
      args: positional arguments for ``fn``: a tuple or list, or a single tensor
        or NumPy array, passed as the one argument.
      kwargs: keyword arguments for ``fn``.
      k: how many tensors to list (at least 1).
      device: ``'CPU:0'``, ``'GPU:0'``, ... or ``None`` for the first GPU if any, else the CPU.
      warmup: calls made before the profiled one.

    Returns:
      A `PeakTensors`; its ``peak_above_baseline_bytes`` is the figure `measure` reports as
      ``peak_above_baseline_bytes`` for the same step.

    Raises:
      TypeError: if ``args`` is neither a tuple, a list, a tensor nor an array.
      ValueError: for a bad ``k`` or device.
      MemoryStatsUnavailableError: if the allocator keeps no statistics.
      RuntimeError: if the profiler recorded no allocation (another profiler running).

    Example:
      >>> step = tf.function(lambda x: tf.reduce_sum(tf.tanh(x @ x)))
      >>> top = largest_live_tensors(step, args=(tf.ones([512, 512]),), k=3, device="CPU:0")
      >>> top.tensors[0].shape
      '[512,512]'
    """
    args, kwargs, device = check_call(fn, args, kwargs, k, device, "largest_live_tensors")
    events, baseline, _ = profiled_call(fn, args, kwargs, device, warmup)
    return dataclasses.replace(replay(events, k), baseline_bytes=baseline)


def _variable_bytes(variable) -> int:
    shape = [int(d) for d in variable.shape]
    return int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(variable.dtype).size


def _shape_text(variable) -> str:
    return "[" + ",".join(str(int(d)) for d in variable.shape) + "]"


def categorize(events, baseline, weights, optimizer_variables, device, k):
    """`MemoryCategories` of a profiled call: its allocation ``events`` replayed to the peak,
    the usage ``baseline`` before it, and the caller's ``weights`` and ``optimizer_variables``."""
    peak_usage, alive, released, survivors = _replay_live(events)
    peak_usage = max(peak_usage, baseline)
    adopted, adopted_bytes = _adopted(released, survivors)
    alive = [entry for entry in alive if id(entry) not in adopted]
    released = sum(released) - adopted_bytes
    trainable = [v for v in weights if getattr(v, "trainable", True)]
    weights_bytes = sum(map(_variable_bytes, weights))
    optimizer_bytes = sum(map(_variable_bytes, optimizer_variables))
    # Keras optimizers run under their own name scope ("adam/..."), where their variables live.
    optimizer_scopes = {str(getattr(v, "path", None) or v.name).split("/")[0] for v in optimizer_variables} - {""}
    unmatched = collections.Counter((_shape_text(v), tf.as_dtype(v.dtype).name) for v in trainable)
    totals = collections.Counter()
    labelled = []
    # Largest first, so that a weight-shaped gradient is matched before a smaller namesake.
    for tensor, allocated in sorted(alive, key=lambda item: item[0].bytes, reverse=True):
        key = (tensor.shape, tensor.dtype)
        if tensor.category == "temporaries" or str(tensor.op).split("/")[0] in optimizer_scopes:
            category = "temporaries"  # the optimizer's arithmetic
        elif not _is_backward(tensor.op):
            category = "activations"
        elif unmatched[key] > 0:
            unmatched[key] -= 1
            category = "gradients"
        else:
            category = "temporaries"
        totals[category] += allocated
        labelled.append(dataclasses.replace(tensor, layer=layer_of(tensor.op), category=category))
    return MemoryCategories(
        device=device, peak_bytes=peak_usage, baseline_bytes=baseline, weights=weights_bytes,
        optimizer=optimizer_bytes,
        inputs_and_other=max(baseline - released - weights_bytes - optimizer_bytes, 0),
        activations=totals["activations"], gradients=totals["gradients"], temporaries=totals["temporaries"],
        tensors=tuple(labelled[:k]))


def checked_variables(weights, optimizer_variables):
    """``weights`` and ``optimizer_variables`` as lists, or a `TypeError` naming the bad one."""
    checked = []
    for values, what in ((weights, "weights"), (optimizer_variables, "optimizer_variables")):
        values = list(values or ())
        for value in values:
            if not (hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "assign")):
                raise TypeError(f"Expected {what} to be variables (tf.Variable or keras.Variable). "
                                f"Received: {value!r}")
        checked.append(values)
    return checked


def memory_by_category(fn, args=(), kwargs=None, *, weights=(), optimizer_variables=(), k=10,
                       device=None, warmup=1) -> MemoryCategories:
    """Splits the peak of one call of ``fn`` (a training step) into what it holds.

    Weights, optimizer state, inputs and other buffers held before the step, activations kept
    for backprop, the weights' gradients, and temporaries. The step runs ``warmup`` times, then
    once under TensorFlow's profiler; the allocator's events are replayed to the moment of
    highest usage and each buffer alive then is classified by the op that made it: forward ops
    make activations; ops in a gradient scope (``gradient_tape/``, ``gradients/``) make the
    weights' gradients (when shaped like a trainable weight) or temporaries. ``peak_bytes`` is
    `measure`'s peak of the same step; the categories sum to it.

    Args:
      fn: the step, e.g. a ``tf.function`` computing a loss and applying its gradients.
      args: positional arguments for ``fn``: a tuple or list, or a single tensor or array.
      kwargs: keyword arguments for ``fn``.
      weights: the model's variables (``model.weights``); the trainable ones identify gradients.
      optimizer_variables: the optimizer's variables (``optimizer.variables``), built already.
      k: how many of the largest buffers alive at the peak to list.
      device: ``'CPU:0'``, ``'GPU:0'``, ... or ``None`` for the first GPU if any, else the CPU.
      warmup: calls made before the profiled one (at least 1 builds an optimizer's slots).

    Returns:
      A `MemoryCategories`.

    Raises:
      TypeError: for a non-callable ``fn``, bad ``args``, or ``weights`` that are not variables.
      ValueError: for a bad ``k`` or device.
      MemoryStatsUnavailableError: if the allocator keeps no statistics.

    Example:
      >>> import keras, memgrad
      >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
      ...                           keras.layers.Dense(1)])
      >>> optimizer = keras.optimizers.SGD(0.01)
      >>> @tf.function
      ... def step(x):
      ...     with tf.GradientTape() as tape:
      ...         loss = tf.reduce_mean(model(x, training=True) ** 2)
      ...     optimizer.apply(tape.gradient(loss, model.trainable_weights), model.trainable_weights)
      >>> split = memgrad.profiler.memory_by_category(step, tf.ones([256, 64]), weights=model.weights,
      ...                                             device="CPU:0")
      >>> split.activations > 0 and split.weights == 4 * (64 * 64 + 64 + 64 + 1)
      True
    """
    args, kwargs, device = check_call(fn, args, kwargs, k, device, "memory_by_category")
    weights, optimizer_variables = checked_variables(weights, optimizer_variables)
    events, baseline, _ = profiled_call(fn, args, kwargs, device, warmup)
    return categorize(events, baseline, weights, optimizer_variables, device, k)


