"""`.keras` files saved by memgrad 0.1 (the earlier layout: zoo imported as `models`,
implementation under memgrad.checkpointing, ...) still load and compute the same outputs.

The files were made by tests/data/make_v0_1_fixtures.py at commit 2a9ab58.
"""

import os

import keras
import numpy as np
import pytest

import memgrad
import memgrad_zoo.densenet
import memgrad_zoo.glow

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
REFERENCE = np.load(os.path.join(DATA, "v0_1_outputs.npz"))


def load(name):
    return keras.saving.load_model(os.path.join(DATA, name))  # safe_mode: registered classes only


def test_a_zoo_densenet_with_recomputed_bottlenecks_loads():
    model = load("densenet16_v0_1.keras")
    bottlenecks = [layer for layer in model._flatten_layers()
                   if isinstance(layer, memgrad_zoo.densenet.EfficientBottleneck)]
    assert bottlenecks and all(layer.recompute for layer in bottlenecks)
    np.testing.assert_allclose(model(REFERENCE["images"], training=False).numpy(), REFERENCE["densenet"],
                               rtol=1e-5, atol=1e-6)


def test_a_reversible_glow_loads():
    model = load("glow_v0_1.keras")
    assert isinstance(model, memgrad_zoo.glow.Glow) and model.reversible
    np.testing.assert_allclose(model.encode(REFERENCE["images"])[1].numpy(), REFERENCE["glow_logdet"],
                               rtol=1e-5)


def test_a_reversible_stack_of_couplings_and_flows_loads():
    model = load("reversible_v0_1.keras")
    stacks = [layer for layer in model.layers if isinstance(layer, memgrad.layers.ReversibleSequence)]
    assert len(stacks) == 1
    kinds = [type(block) for block in stacks[0].blocks]
    assert kinds == [memgrad.layers.AdditiveCoupling, memgrad.layers.AffineCoupling,
                     memgrad.layers.ActNorm, memgrad.layers.Invertible1x1Conv]
    images = REFERENCE["images"]
    x = np.concatenate([images, images * 0.5], axis=-1)
    np.testing.assert_allclose(model(x, training=False).numpy(), REFERENCE["reversible"], rtol=1e-5, atol=1e-6)


def test_selective_layers_and_the_checkpoint_marker_load_as_the_same_classes():
    model = load("selective_v0_1.keras")
    kinds = {type(layer) for layer in model.layers}
    assert {memgrad.selective.Conv2D, memgrad.selective.BatchNormalization, memgrad.selective.ReLU,
            memgrad.selective.MaxPooling2D, memgrad.selective.Dense, memgrad.layers.Checkpoint} <= kinds
    np.testing.assert_allclose(model(REFERENCE["images"], training=False).numpy(), REFERENCE["selective"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["densenet16_v0_1.keras", "glow_v0_1.keras"])
def test_zoo_files_name_the_zoo_classes_by_registered_name_not_module(name):
    """The files record `registered_name` (package>Class), which survives the module rename."""
    import json
    import zipfile

    with zipfile.ZipFile(os.path.join(DATA, name)) as archive:
        config = json.loads(archive.read("config.json"))
    names = set()

    def walk(node):
        if isinstance(node, dict):
            if "registered_name" in node and isinstance(node["registered_name"], str):
                names.add(node["registered_name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    assert any(n.startswith("memgrad_models>") for n in names), names
