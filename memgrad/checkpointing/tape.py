"""`memgrad.GradientTape`: a drop-in for `tf.GradientTape` whose gradients are checkpointed."""

import warnings

import tensorflow as tf

from memgrad.checkpointing.api import gradients

_warned_eager = []


class GradientTape(tf.GradientTape):
    """A `tf.GradientTape` whose `gradient` recomputes activations instead of keeping them.

    Inside a `tf.function` (where training steps run), `tape.gradient(target, sources)`
    calls `memgrad.gradients` on the traced graph with the tape's `checkpoints` strategy.
    In eager mode there is no graph to rewrite, so the tape behaves exactly like
    `tf.GradientTape` (and warns once).

    Inside a graph, tensor sources are differentiated like `tf.gradients` does, whether or
    not the tape watched them; variables behave as with `tf.GradientTape`.

    Args:
      persistent: as for `tf.GradientTape`.
      watch_accessed_variables: as for `tf.GradientTape`.
      checkpoints: the strategy: `'memory'`, `'speed'`, `'collection'`, a list of
        tensors, or a `memgrad.Budget` (see `memgrad.gradients`).

    Example:
      ```python
      @tf.function
      def train_step(x, y):
          with memgrad.GradientTape(checkpoints="memory") as tape:
              loss = loss_fn(y, model(x, training=True))
          grads = tape.gradient(loss, model.trainable_variables)
          optimizer.apply_gradients(zip(grads, model.trainable_variables))
      ```
    """

    def __init__(self, persistent=False, watch_accessed_variables=True, checkpoints="memory"):
        super().__init__(persistent=persistent, watch_accessed_variables=watch_accessed_variables)
        self.checkpoints = checkpoints

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Gradients of `target` with respect to `sources` (same contract as tf.GradientTape).

        Args:
          target: a tensor or nested structure of tensors to differentiate.
          sources: a tensor, variable, or nested structure of them.
          output_gradients: optional incoming gradients, one per target.
          unconnected_gradients: `'none'` or `'zero'`.

        Returns:
          Gradients with the structure of `sources`.
        """
        if tf.executing_eagerly():
            if not _warned_eager:
                _warned_eager.append(True)
                warnings.warn(
                    "memgrad.GradientTape is running eagerly, where there is no graph to "
                    "rewrite: gradients are plain tf.GradientTape gradients. Run the step "
                    "in a tf.function to checkpoint.",
                    stacklevel=2,
                )
            return super().gradient(
                target, sources, output_gradients=output_gradients,
                unconnected_gradients=unconnected_gradients,
            )
        if self._recording and not self._persistent:
            self._pop_tape()
        flat_targets = tf.nest.flatten(target)
        flat_sources = tf.nest.flatten(sources, expand_composites=False)
        grad_ys = None
        if output_gradients is not None:
            grad_ys = tf.nest.flatten(output_gradients)
        grads = gradients(
            flat_targets, flat_sources, grad_ys=grad_ys, checkpoints=self.checkpoints,
            unconnected_gradients=unconnected_gradients,
        )
        return tf.nest.pack_sequence_as(sources, grads)
