"""Gradient parts that reach one tensor from several segments: filed per kept tensor or x
(`GradientParts`) and summed (`aggregate`)."""

import collections

import tensorflow as tf

from memgrad._src.checkpointing import gradient_walk


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
    return tf.math.add_n(gradient_walk.add_n_order([tf.convert_to_tensor(p) for p in parts]))


def dense(grad):
    """A dense tensor for a gradient that may be `tf.IndexedSlices`."""
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def dense_parts(grad):
    """The dense tensors a gradient is made of (an `IndexedSlices`' values and indices)."""
    if isinstance(grad, tf.IndexedSlices):
        return [grad.values, grad.indices]
    return [grad]


class GradientParts:
    """Gradient parts as the segments make them: per checkpoint (``kept``) and per leaf x
    (``x_parts``, an x nothing upstream depends on)."""

    def __init__(self, rewrite):
        self.rewrite = rewrite
        self.kept = collections.defaultdict(list)
        self.x_parts = collections.defaultdict(list)

    def route(self, t, grad):
        """Files ``grad``, the gradient with respect to ``t``, under the checkpoint or the x
        that ``t`` is (or reads); drops it otherwise (a constant, a parameter not asked
        for)."""
        if grad is None:
            return
        ref = t.ref()
        if ref in self.rewrite.checkpoints:
            self.kept[ref].append(grad)
            return
        x_ref = self.rewrite.x_ref(t)
        if x_ref is not None:
            self.x_parts[x_ref].append(grad)

    def results(self):
        """One gradient per x of the view (the sum of its parts), None where it has none."""
        results = []
        for t in self.rewrite.view.x_tensors:
            ref = t.ref()
            found = (self.kept.get(ref, []) if ref in self.rewrite.checkpoints else [])
            found = found + self.x_parts.get(ref, [])
            results.append(aggregate(found) if found else None)
        return results
