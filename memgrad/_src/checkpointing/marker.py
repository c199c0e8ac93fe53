"""Marking tensors for ``checkpoints='collection'``: `mark_checkpoint` and the `Checkpoint` layer."""

import keras
import tensorflow as tf

from memgrad._src.checkpointing.plans import COLLECTION


@tf.autograph.experimental.do_not_convert
def mark_checkpoint(tensor):
    """Mark a tensor for `checkpoints='collection'` and return it unchanged.

    Inside a `tf.function` the tensor is added to the graph's `'checkpoints'` collection;
    in eager mode nothing is recorded (there is no graph to rewrite).

    Args:
      tensor: a tensor computed in the forward pass.

    Returns:
      The same tensor.

    Raises:
      TypeError: if ``tensor`` is not a `tf.Tensor` (a number, a NumPy array, a variable).

    Example:
      ```python
      h = memgrad.mark_checkpoint(block(h))
      ```
    """
    if not tf.is_tensor(tensor) or hasattr(tensor, "assign"):  # a variable is no forward tensor
        raise TypeError(
            "memgrad.mark_checkpoint marks a tensor computed in the forward pass; expected a "
            f"tf.Tensor. Received: {type(tensor).__name__} {tensor!r}"
        )
    if tf.is_symbolic_tensor(tensor):
        tensor.graph.add_to_collection(COLLECTION, tensor)
    return tensor


@keras.saving.register_keras_serializable(package="memgrad")
class Checkpoint(keras.layers.Layer):
    """An identity layer that marks its output for `checkpoints='collection'`.

    Example:
      ```python
      h = keras.layers.Dense(512, activation="relu")(h)
      h = memgrad.layers.Checkpoint()(h)
      ```
    """

    def call(self, inputs):
        return tf.nest.map_structure(mark_checkpoint, inputs)

    def compute_output_shape(self, input_shape):
        return input_shape
