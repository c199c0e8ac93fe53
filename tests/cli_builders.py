"""Builders passed to `memgrad-profile --model tests.cli_builders:NAME` by the CLI tests."""

import keras


def mlp(depth=3):
    """A ReLU MLP of ``depth`` Dense layers on 32 features."""
    layers = [keras.Input((32,))]
    for _ in range(depth):
        layers.append(keras.layers.Dense(64, activation="relu"))
    layers.append(keras.layers.Dense(4))
    return keras.Sequential(layers)


def not_a_model(depth=1):
    """Returns something that is not a Keras model."""
    return [depth]
