"""`largest_live_tensors(fn)`: the tensors alive at the peak of one call, from TensorFlow's profiler.

TensorFlow's profiler records every allocation and deallocation of the device's allocator
(with the op that asked for it, the tensor's shape and dtype) when the allocator keeps
statistics (BFC on CPU, always on GPU). Replaying those events in time order gives the set of
buffers alive when the allocator's usage was highest: what a user should checkpoint.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import tempfile

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.arguments import positional_args
from memgrad._src.profiler.measure import _memory_info, _sync, _warn_if_coarse, resolve_device
from memgrad._src.units import format_bytes


@dataclasses.dataclass(frozen=True)
class LiveTensor:
    """One buffer alive at the peak.

    Attributes:
      op: the name of the op that allocated it (``'?'`` if the profiler did not say).
      shape: the tensor's shape as TensorFlow printed it, e.g. ``'[512,256]'``.
      dtype: the dtype's name, e.g. ``'float32'`` (``'?'`` if unknown).
      bytes: the bytes requested for it.
    """

    op: str
    shape: str
    dtype: str
    bytes: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PeakTensors:
    """The result of `largest_live_tensors`.

    Attributes:
      peak_bytes: the allocator's usage at the peak of the call, as the profiler saw it.
      tensors: the largest buffers allocated during the call and alive at that peak, largest first.
      other_bytes: the rest of the usage at the peak (smaller buffers, and buffers allocated
        before the call, such as the weights and inputs).
    """

    peak_bytes: int
    tensors: tuple
    other_bytes: int

    def __str__(self) -> str:
        lines = [f"peak {format_bytes(self.peak_bytes)}; largest tensors alive at the peak:"]
        for t in self.tensors:
            lines.append(f"  {format_bytes(t.bytes):>11}  {t.dtype:<9} {t.shape:<20} {t.op}")
        lines.append(f"  {format_bytes(self.other_bytes):>11}  everything else (weights, inputs, smaller tensors)")
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


def replay(events, k):
    """The `PeakTensors` of allocation events (``(time, kind, stats)``, time-ordered)."""
    live, peak_usage, peak_live = {}, -1, {}
    for _, kind, stats in events:
        address = stats.get("addr")
        if kind == "MemoryAllocation":
            live[address] = LiveTensor(
                op=str(stats.get("tf_op") or "?"), shape=str(stats.get("shape") or "?"),
                dtype=_dtype_name(stats.get("data_type")), bytes=int(stats.get("requested_bytes") or 0))
        else:
            live.pop(address, None)
        usage = int(stats.get("bytes_allocated") or 0)
        if usage > peak_usage:
            peak_usage, peak_live = usage, dict(live)
    tensors = sorted(peak_live.values(), key=lambda t: t.bytes, reverse=True)[:k]
    peak_usage = max(peak_usage, 0)
    return PeakTensors(peak_bytes=peak_usage, tensors=tuple(tensors),
                       other_bytes=max(peak_usage - sum(t.bytes for t in tensors), 0))


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
      A `PeakTensors`.

    Raises:
      TypeError: if ``args`` is neither a tuple, a list, a tensor nor an array.
      ValueError: for a bad ``k`` or device.
      MemoryStatsUnavailableError: if the allocator keeps no statistics (on CPU, set
        ``TF_CPU_ALLOCATOR_USE_BFC=true`` before TensorFlow is imported).
      RuntimeError: if the profiler recorded no allocation (another profiler running).

    Example:
      >>> step = tf.function(lambda x: tf.reduce_sum(tf.tanh(x @ x)))
      >>> top = largest_live_tensors(step, args=(tf.ones([512, 512]),), k=3, device="CPU:0")
      >>> top.tensors[0].shape
      '[512,512]'
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"Expected k to be an int >= 1. Received: {k!r}")
    xplane_pb2 = tf_internals.xplane_pb2()

    args = positional_args(args)
    kwargs = dict(kwargs or {})
    device = resolve_device(device)
    _memory_info(device)
    _warn_if_coarse(device)
    logdir = tempfile.mkdtemp(prefix="memgrad-top-")
    try:
        with tf.device(device):
            for _ in range(warmup):
                fn(*args, **kwargs)
            _sync()
            tf.profiler.experimental.start(logdir)
            try:
                fn(*args, **kwargs)
                _sync()
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
    return replay(events, k)
