"""`BijectorBlock`: a tensorflow-probability bijector as a block of a `ReversibleSequence`."""

from __future__ import annotations

import tensorflow as tf

from memgrad.reversible.base import ReversibleBlock


class BijectorBlock(ReversibleBlock):
    """Runs a ``tfp.bijectors.Bijector`` inside a constant-memory stack (Algorithm 1 path).

    Every axis but the batch axis is one event: the block's log-det is the
    bijector's ``forward_log_det_jacobian`` with ``event_ndims = rank - 1``.
    The bijector's own ``tf.Variable`` s receive gradients through the stack, but
    Keras does not track them: collect them with ``block.bijector.trainable_variables``.
    Bijectors are not Keras-serialisable, so neither is this block.

    Args:
      bijector: a ``tfp.bijectors.Bijector`` acting on channels-last inputs.
      **kwargs: Keras layer arguments.

    Example:
      >>> import tensorflow_probability as tfp
      >>> stack = ReversibleSequence([tfp.bijectors.Scale(2.0)], return_logdet=True)
      >>> y, logdet = stack(tf.ones([3, 4]))    # logdet = 4 * log 2 per example
    """

    def __init__(self, bijector, **kwargs):
        super().__init__(**kwargs)
        self.bijector = bijector

    def forward(self, x, training=None):
        y = self.bijector.forward(x)
        logdet = self.bijector.forward_log_det_jacobian(x, event_ndims=x.shape.rank - 1)
        return y, tf.zeros(tf.shape(x)[:1], x.dtype) + tf.cast(logdet, x.dtype)

    def inverse(self, y, training=None):
        return self.bijector.inverse(y)

    def get_config(self):
        raise NotImplementedError(
            f"BijectorBlock wraps {type(self.bijector).__name__}, a tensorflow-probability "
            "bijector, which Keras cannot serialise; save the weights instead, or write the "
            "transformation as a ReversibleBlock subclass."
        )
