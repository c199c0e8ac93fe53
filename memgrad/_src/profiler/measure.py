"""`measure(fn)`: peak tensor memory and wall time of one call, on CPU or GPU."""

from __future__ import annotations

import gc
import os
import re
import statistics
import time
import warnings

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.allocator import MemoryWindow, statistics as allocator_statistics
from memgrad._src.arguments import positional_args
from memgrad._src.profiler.report import MemoryReport

_DEVICE_PATTERN = re.compile(r"^/?(?:device:)?(CPU|GPU):(\d+)$", re.IGNORECASE)


class MemoryStatsUnavailableError(RuntimeError):
    """The device's allocator keeps no statistics, so memory cannot be measured."""


def default_device() -> str:
    """``'GPU:0'`` when TensorFlow sees a GPU, else ``'CPU:0'``."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def resolve_device(device=None) -> str:
    """Validates a device name and returns it in the short form ``'CPU:0'``/``'GPU:1'``.

    Args:
      device: ``None`` for the default device (the first GPU if any, else the
        CPU), or a string such as ``'CPU:0'``, ``'GPU:0'`` or ``'/device:GPU:0'``.

    Returns:
      The normalised device name.

    Raises:
      ValueError: if the string is not a CPU/GPU device name, or TensorFlow has
        no such device on this machine.
    """
    if device is None:
        return default_device()
    match = _DEVICE_PATTERN.match(device) if isinstance(device, str) else None
    if match is None:
        raise ValueError(
            "Expected a device name such as 'CPU:0' or 'GPU:0' (memory can be measured "
            f"on CPU and GPU devices). Received: {device!r}"
        )
    kind, index = match.group(1).upper(), int(match.group(2))
    available = [d.name.split("device:")[-1] for d in tf.config.list_logical_devices(kind)]
    name = f"{kind}:{index}"
    if name not in available:
        raise ValueError(
            f"Device {name!r} does not exist on this machine; available {kind} devices: "
            f"{available or 'none'}. Received: {device!r}"
        )
    return name


def memory_info(device: str) -> dict:
    try:
        return allocator_statistics(device)
    except (ValueError, tf.errors.OpError) as error:
        raise MemoryStatsUnavailableError(_no_statistics(device, error)) from error


def _no_statistics(device: str, error) -> str:
    """One line: why ``device``'s allocator keeps no statistics, and the one thing to do."""
    if not device.startswith("CPU"):
        return f"TensorFlow keeps no allocator statistics for {device} ({error})."
    chosen = os.environ.get(CPU_BFC_VARIABLE)
    if chosen is not None and chosen.lower() not in ("1", "true"):
        return (f"TensorFlow keeps no memory statistics for {device}: {CPU_BFC_VARIABLE}={chosen!r} turns "
                "off the allocator that keeps them; unset it (memgrad then sets it when imported).")
    return (f"TensorFlow keeps no memory statistics for {device}: its CPU allocator was chosen when the "
            "first TensorFlow op ran, before memgrad was imported; import memgrad before running any "
            f"TensorFlow op (or start Python with {CPU_BFC_VARIABLE}=true).")


CPU_BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"  # memgrad sets it when imported (tf_internals)
_warned_coarse_cpu_stats = False


def exact_cpu_stats_enabled() -> bool:
    """Whether TensorFlow's CPU allocator is the BFC allocator, whose statistics count every byte.

    TensorFlow's default CPU allocator keeps no statistics (or, with oneDNN on
    AVX-512 CPUs, leaves allocations below a few hundred KiB out of them). Importing
    memgrad before TensorFlow runs its first op sets ``TF_CPU_ALLOCATOR_USE_BFC=true``,
    which makes CPU figures exact; a value the user set is kept.
    """
    return os.environ.get(CPU_BFC_VARIABLE, "").lower() in ("1", "true")


def _warn_if_coarse(device: str) -> None:
    global _warned_coarse_cpu_stats
    if device.startswith("CPU") and not exact_cpu_stats_enabled() and not _warned_coarse_cpu_stats:
        _warned_coarse_cpu_stats = True
        warnings.warn(
            "TensorFlow's default CPU allocator does not count allocations below a few hundred "
            "KiB, so small tensors are missing from CPU figures. For exact figures, import memgrad "
            "before running any TensorFlow op (or start Python with TF_CPU_ALLOCATOR_USE_BFC=true).",
            stacklevel=3,
        )


def onednn_enabled() -> bool:
    """Whether this TensorFlow runs oneDNN's custom CPU kernels.

    TensorFlow turns them on by itself on CPUs with AVX-512 (``TF_ENABLE_ONEDNN_OPTS=0``
    turns them off, ``=1`` on). Measured peaks differ with them: oneDNN's convolution
    gradients need no large working set, Eigen's do, and under oneDNN the CPU allocator's
    statistics can be coarser (see docs/profiler.md).

    Returns:
      True when they are on.

    Example:
      ```python
      print("oneDNN", "on" if memgrad.profiler.onednn_enabled() else "off")
      ```
    """
    return bool(tf_internals.onednn_enabled())


def sync_devices() -> None:
    # Kernels launch asynchronously on GPU: wait for them before reading the clock.
    sync = getattr(getattr(tf.test, "experimental", None), "sync_devices", None)
    if sync is not None and tf.config.list_logical_devices("GPU"):
        sync()


def prepare_call(fn, args, kwargs, device, name="measure"):
    """Checks a call to measure or profile (``name`` is the caller, for the error):
    ``(args, kwargs, device)`` normalised, after making sure the device keeps statistics
    (before any work) and warning once if they are coarse."""
    if not callable(fn):
        raise TypeError(f"{name}() expected a callable to measure. Received: {fn!r}")
    args = positional_args(args)
    kwargs = dict(kwargs or {})
    device = resolve_device(device)
    memory_info(device)
    _warn_if_coarse(device)
    return args, kwargs, device


def _checked_counts(warmup, repeats):
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"Expected warmup to be an int >= 0. Received: {warmup!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"Expected repeats to be an int >= 1. Received: {repeats!r}")


def memory_window(device=None) -> MemoryWindow:
    """A ``with`` block's peak, baseline and held bytes on a device.

    For what is not one call (a `Session.run`, what a tape holds between the forward and
    the backward pass): entering resets the device's peak counter and reads the bytes held,
    leaving reads the peak and the bytes still held. `measure_runs` measures calls with it.
    The counter is the device's, so windows do not nest.

    Args:
      device: ``'CPU:0'``, ``'GPU:0'``, ... or ``None`` for the first GPU if any, else the CPU.

    Returns:
      A `MemoryWindow`; after the block, its ``baseline_bytes``, ``peak_bytes``,
      ``end_bytes``, ``peak_above_baseline_bytes`` and ``held_bytes``.

    Raises:
      ValueError: for an unknown device.
      MemoryStatsUnavailableError: if the allocator keeps no statistics.

    Example:
      >>> import tensorflow as tf, memgrad
      >>> x = tf.ones([256, 256])
      >>> with memgrad.profiler.memory_window("CPU:0") as window:
      ...     y = tf.tanh(x) * 2.0
      >>> window.held_bytes >= 256 * 256 * 4, window.peak_above_baseline_bytes >= window.held_bytes
      (True, True)
    """
    device = resolve_device(device)
    memory_info(device)
    _warn_if_coarse(device)
    return MemoryWindow(device)


def measure_runs(fn, args=(), kwargs=None, *, device=None, warmup=1, repeats=5, processes=None, env=None):
    """Every run's peak and wall time of ``repeats`` calls of ``fn(*args, **kwargs)``.

    The one way memgrad measures a call: ``warmup`` calls first (a ``tf.function`` is
    traced and its one-time allocations are made), then, for each measured call, the
    allocator's current bytes are read (that call's baseline: weights, inputs, whatever
    lives between calls), its peak counter reset, the call run and its peak read (a
    `memory_window` around the call). A step's
    peak moves from call to call with the order in which the executor's threads run ready
    ops (5-10% on two CPU cores; fixed within a process with ``TF_NUM_INTEROP_THREADS=1``
    set before TensorFlow starts) and with the allocator's chunk fitting (a few percent in
    a fixed order; `largest_live_tensors`' ``requested_peak_bytes`` leaves it out), so
    callers choose what to read of the runs: their largest, median or range.

    Between processes a peak moves further (a small transformer's plain step: 44.1 vs 55.5
    MiB in two fresh processes). With ``processes=n`` the step is measured in ``n`` fresh
    processes, one after another: ``fn`` is then a ``'module:function'`` string naming a
    function that builds the call, ``build(**kwargs) -> fn`` or ``(fn, args)``, and the result
    is a `RunSpread` with every call's report and the processes' min, median and max.

    Args:
      fn: the callable to measure, e.g. a ``tf.function`` training step.
      args: positional arguments for ``fn``: a tuple or list, or a single tensor or NumPy
        array, passed as the one argument.
      kwargs: keyword arguments for ``fn``.
      device: ``'CPU:0'``, ``'GPU:0'``, ... or ``None`` for the first GPU if any, else the
        CPU. The calls run under ``tf.device(device)``.
      warmup: calls made before measuring (at least 0).
      repeats: measured calls (at least 1), in each process.
      processes: ``None`` to measure in this process; a positive integer to measure in that
        many fresh processes (``fn`` then names the builder, ``kwargs`` are its arguments).
      env: with ``processes``, environment variables for the fresh processes on top of this
        one's, e.g. ``{"TF_NUM_INTEROP_THREADS": "1"}`` to fix the executor's order.

    Returns:
      A list of ``repeats`` `MemoryReport`, one per measured call in call order, each with
      its own ``peak_bytes``, ``baseline_bytes``, ``peak_above_baseline_bytes`` and
      ``wall_time_s``. With ``processes``: a `RunSpread` (``processes``: each process's
      list; ``min_bytes``, ``median_bytes``, ``max_bytes`` and ``relative_spread`` of the
      processes' median peaks above their baselines).

    Raises:
      TypeError, ValueError, MemoryStatsUnavailableError: as `measure`; ValueError for a
        ``processes`` that is not a positive integer, or ``args`` given with it.
      FreshProcessError: with ``processes``, if a process failed (its error attached).

    Example:
      >>> import tensorflow as tf, memgrad
      >>> step = tf.function(lambda x: tf.reduce_sum(tf.tanh(x) * 2.0))
      >>> runs = memgrad.profiler.measure_runs(step, args=(tf.ones([256, 256]),), repeats=3)
      >>> len(runs), all(run.peak_above_baseline_bytes > 0 for run in runs)
      (3, True)

      Over fresh processes (a builder returning ``(step, args)``)::

        spread = memgrad.profiler.measure_runs(
            "memgrad.profiler.workloads:transformer_step", kwargs={"batch_size": 8},
            processes=3, repeats=3)
        print(spread)   # RunSpread(3 processes: median ..., range ... - ..., spread ...%)
    """
    _checked_counts(warmup, repeats)
    if processes is not None:
        from memgrad._src.profiler.spread import measure_in_fresh_processes

        if args not in ((), [], None):
            raise ValueError("With processes, the builder named by fn makes the call's arguments; pass its own "
                             f"arguments as kwargs. Received: args={args!r}")
        return measure_in_fresh_processes(fn, kwargs, processes=processes, device=device, warmup=warmup,
                                          repeats=repeats, env=env)
    if env is not None:
        raise ValueError(f"env applies only to fresh processes (processes=n). Received: env={env!r}")
    args, kwargs, device = prepare_call(fn, args, kwargs, device)
    with tf.device(device):
        for _ in range(warmup):
            result = fn(*args, **kwargs)
            sync_devices()
            del result
        gc.collect()

        runs = []
        for _ in range(repeats):
            with MemoryWindow(device) as window:
                start = time.perf_counter()
                result = fn(*args, **kwargs)
                sync_devices()
                seconds = time.perf_counter() - start
            del result
            gc.collect()
            runs.append(MemoryReport(device=device, peak_bytes=window.peak_bytes,
                                     baseline_bytes=window.baseline_bytes, wall_time_s=float(seconds)))
    return runs


def measure(fn, args=(), kwargs=None, *, device=None, warmup=1, repeats=1) -> MemoryReport:
    """Measures the peak tensor memory and wall time of ``fn(*args, **kwargs)``.

    The call is warmed up first (so a ``tf.function`` is traced and its one-time
    allocations are done), the device's peak counter is reset, then the call runs
    and the allocator's peak is read. Only TensorFlow tensor buffers count, not
    Python or NumPy memory. Every run's figures: `measure_runs`.

    Args:
      fn: the callable to measure, e.g. a ``tf.function`` training step.
      args: positional arguments for ``fn``: a tuple or list, or a single tensor
        or NumPy array, passed as the one argument (``args=x`` is ``args=(x,)``).
      kwargs: keyword arguments for ``fn``.
      device: ``'CPU:0'``, ``'GPU:0'``, ... or ``None`` for the first GPU if any,
        else the CPU. The call runs under ``tf.device(device)``.
      warmup: calls made before measuring (at least 0).
      repeats: measured calls; the peak is the largest, the time the median.

    Returns:
      A `MemoryReport` with ``peak_bytes``, ``baseline_bytes``,
      ``peak_above_baseline_bytes``, ``wall_time_s`` and ``device``.

    Raises:
      TypeError: if ``fn`` is not callable, or ``args`` is neither a tuple, a list,
        a tensor nor an array.
      ValueError: for an unknown device or a bad ``warmup``/``repeats``.
      MemoryStatsUnavailableError: if the allocator keeps no statistics.

    Example:
      >>> import tensorflow as tf, memgrad
      >>> step = tf.function(lambda x: tf.reduce_sum(tf.tanh(x) * 2.0))
      >>> report = memgrad.profiler.measure(step, args=(tf.ones([256, 256]),), device="CPU:0")
      >>> report.peak_above_baseline_bytes > 0
      True
    """
    runs = measure_runs(fn, args, kwargs, device=device, warmup=warmup, repeats=repeats)
    return MemoryReport(
        device=runs[0].device,
        peak_bytes=max(run.peak_bytes for run in runs),
        baseline_bytes=min(run.baseline_bytes for run in runs),
        wall_time_s=float(statistics.median(run.wall_time_s for run in runs)),
    )
