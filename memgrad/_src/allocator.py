"""The one place memgrad reads a device allocator's statistics. Imports nothing of memgrad.

TensorFlow keeps, per device, the bytes its allocator holds now (``current``) and the most
it has held since the counter was last reset (``peak``): a GPU's allocator always, the CPU's
when it is the BFC allocator (memgrad asks for it at import). `MemoryWindow` reads them
around a block of code; everything that measures memory in memgrad (the profiler's
`measure_runs`, the kernels' scratch, the capped subprocess) and in its tests goes through it.
"""

from __future__ import annotations

import tensorflow as tf


def statistics(device: str) -> dict:
    """``{'current': bytes, 'peak': bytes}`` of ``device``'s allocator (``'CPU:0'``, ``'GPU:0'``).

    Raises ValueError or `tf.errors.OpError` when the allocator keeps no statistics.
    """
    return tf.config.experimental.get_memory_info(device)


def statistics_available(device: str) -> bool:
    """Whether ``device``'s allocator keeps statistics (read outside any graph being built)."""
    try:
        with tf.init_scope():
            statistics(device)
    except (ValueError, tf.errors.OpError):
        return False
    return True


class MemoryWindow:
    """What a device's allocator held while a ``with`` block ran.

    On entry the bytes held (the baseline) are read and the peak counter is reset; on exit
    the peak and the bytes still held are read. Only tensor buffers count, not Python's or
    NumPy's memory. The counter is the device's, so windows do not nest: an inner window's
    entry resets the outer one's peak.

    Attributes (after the block):
      device: the device read.
      baseline_bytes: bytes held when the block started (weights, inputs, whatever lives).
      peak_bytes: the most held at any moment in the block, baseline included.
      end_bytes: bytes held when the block ended.
      peak_above_baseline_bytes: ``peak_bytes - baseline_bytes``.
      held_bytes: ``end_bytes - baseline_bytes``: what the block left allocated.

    Example:
      >>> import gc, tensorflow as tf, memgrad
      >>> _ = gc.collect()  # earlier garbage freed inside the window would offset what it holds
      >>> with memgrad.profiler.MemoryWindow("CPU:0") as window:
      ...     y = tf.ones([1024, 256])
      >>> window.held_bytes >= 1024 * 256 * 4
      True
    """

    def __init__(self, device: str = "CPU:0"):
        self.device = device
        self.baseline_bytes = self.peak_bytes = self.end_bytes = None

    def __enter__(self) -> "MemoryWindow":
        self.baseline_bytes = int(statistics(self.device)["current"])
        tf.config.experimental.reset_memory_stats(self.device)
        return self

    def __exit__(self, *exc_info) -> None:
        info = statistics(self.device)
        self.peak_bytes, self.end_bytes = int(info["peak"]), int(info["current"])

    @property
    def peak_above_baseline_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes

    @property
    def held_bytes(self) -> int:
        return self.end_bytes - self.baseline_bytes

    def __repr__(self) -> str:
        return (f"MemoryWindow(device={self.device!r}, baseline_bytes={self.baseline_bytes}, "
                f"peak_bytes={self.peak_bytes}, end_bytes={self.end_bytes})")
