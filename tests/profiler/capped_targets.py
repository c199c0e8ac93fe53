"""Workloads run by the emulated-device tests in a capped subprocess."""

import tensorflow as tf


def hold(batch_size: int, mib_per_item: int = 4) -> None:
    """Keeps ``batch_size`` float32 tensors of ``mib_per_item`` MiB alive at once."""
    floats = mib_per_item * 2**20 // 4
    items = [tf.fill([floats], float(i)) for i in range(batch_size)]
    tf.add_n([tf.reduce_sum(item) for item in items]).numpy()


def fail() -> None:
    """Fails for a reason other than memory."""
    raise ValueError("not a memory problem")
