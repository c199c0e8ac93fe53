"""The `Checkpoint` layer: marks a Keras tensor for ``checkpoints='collection'``."""

import keras
import tensorflow as tf

from memgrad._src.checkpointing.api import mark_checkpoint


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
