"""memgrad.gradients equals tf.gradients on the graph shapes checkpointing must handle."""

import keras
import pytest
import tensorflow as tf

import memgrad
from tests.checkpointing.models import BUILDERS, loss_fn, max_relative_error, rewritten


def _both(model, x, y, checkpoints):
    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        loss = loss_fn(y, model(x, training=True))
        return tf.gradients(loss, variables), memgrad.gradients(
            loss, variables, checkpoints=checkpoints)

    return step(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("checkpoints", ["memory", "speed"])
def test_matches_tf_gradients(name, checkpoints):
    keras.utils.set_random_seed(0)
    model, x, y = BUILDERS[name]()
    # 'speed' runs plain backprop where it would free under 5% (tanh and ReLU chains).
    with rewritten(allow_plain_speed=True):
        reference, checkpointed = _both(model, x, y, checkpoints)
    assert len(reference) == len(checkpointed) == len(model.trainable_variables)
    for a, b in zip(reference, checkpointed):
        assert (a is None) == (b is None)
    assert max_relative_error(reference, checkpointed) <= 1e-5
