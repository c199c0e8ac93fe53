"""Summing gradient parts that reach one tensor from several segments."""

import tensorflow as tf


def aggregate(parts):
    """Sum gradient parts: dense tensors with add_n, IndexedSlices by concatenation.

    Args:
      parts: a non-empty list of `tf.Tensor` or `tf.IndexedSlices`.

    Returns:
      A dense tensor, or `tf.IndexedSlices` when every part is one (embedding gradients
      stay sparse, as with `tf.gradients`).
    """
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, tf.IndexedSlices) for p in parts):
        dense_shape = next((p.dense_shape for p in parts if p.dense_shape is not None), None)
        return tf.IndexedSlices(
            tf.concat([p.values for p in parts], axis=0),
            tf.concat([p.indices for p in parts], axis=0),
            dense_shape,
        )
    return tf.math.add_n([tf.convert_to_tensor(p) for p in parts])


def dense(grad):
    """A dense tensor for a gradient that may be `tf.IndexedSlices`."""
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad
