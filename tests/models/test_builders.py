"""Zoo builders: shapes, the papers' parameter counts, depth rules and clear errors."""

import re

import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import ReversibleSequence
from memgrad_zoo import densenet, resnet, revnet
from memgrad_zoo.layers import RevNetDownsample


def trainable_parameters(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


@pytest.mark.slow
@pytest.mark.parametrize("depth", sorted(resnet.PAPER))
def test_resnet_parameters_match_the_revnet_papers_table(depth):
    expected = resnet.PAPER[depth][2]
    count = trainable_parameters(resnet.resnet(depth, input_shape=(8, 8, 3)))
    assert abs(count / expected - 1) <= 0.03, f"ResNet-{depth}: {count} vs {expected:.0f}"


@pytest.mark.slow
@pytest.mark.parametrize("depth", sorted(revnet.PAPER))
def test_revnet_parameters_match_the_papers_table(depth):
    expected = revnet.PAPER[depth][3]
    count = trainable_parameters(revnet.revnet(depth, input_shape=(8, 8, 3)))
    assert abs(count / expected - 1) <= 0.03, f"RevNet-{depth}: {count} vs {expected:.0f}"


@pytest.mark.slow
def test_densenet_bc_100_has_the_papers_08m_parameters():
    # The paper gives one significant figure (0.8M); the count must round to it.
    count = trainable_parameters(densenet.densenet_bc(100, 12, input_shape=(8, 8, 3)))
    assert round(count / 1e6, 1) == 0.8, count



@pytest.mark.slow
def test_revnet_with_plain_backprop_is_the_same_network():
    reversible = revnet.revnet(38, input_shape=(8, 8, 3))
    plain = revnet.revnet(38, input_shape=(8, 8, 3), reversible=False)
    assert trainable_parameters(plain) == trainable_parameters(reversible)
    stages = [layer for layer in plain.layers if isinstance(layer, ReversibleSequence)]
    assert len(stages) == 3 and all(stage.plain_backprop for stage in stages)
    plain.set_weights(reversible.get_weights())
    x = np.random.default_rng(0).uniform(size=(2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(plain(x).numpy(), reversible(x).numpy(), rtol=1e-5, atol=1e-6)

@pytest.mark.slow
def test_revnet_stages_are_reversible_between_downsampling_units():
    model = revnet.revnet(38, input_shape=(32, 32, 3))
    stacks = [layer for layer in model.layers if isinstance(layer, ReversibleSequence)]
    downsampling = [layer for layer in model.layers if isinstance(layer, RevNetDownsample)]
    # 32-32-64-112: stage 1 keeps its width (3 reversible units); stages 2 and 3 start with a
    # downsampling unit followed by 2 reversible ones.
    assert [len(s.blocks) for s in stacks] == [3, 2, 2]
    assert [d.stride for d in downsampling] == [2, 2]


@pytest.mark.parametrize("builder, depth", [
    (resnet.resnet, 20), (resnet.resnet, 29), (revnet.revnet, 26), (revnet.revnet, 38),
    (densenet.densenet_bc, 16),
])
@pytest.mark.slow
def test_builders_map_images_to_logits(builder, depth):
    model = builder(depth, num_classes=7, input_shape=(8, 8, 1))
    logits = model(tf.random.normal([3, 8, 8, 1]), training=False)
    assert logits.shape == (3, 7)
    assert np.all(np.isfinite(logits.numpy()))


def test_depth_rules():
    assert resnet.units_per_stage(56) == (9, False)
    assert resnet.units_per_stage(29) == (3, True)  # 9n + 2 only
    assert resnet.units_per_stage(602, layers_per_unit=(4, 6), family="RevNet") == (50, False)
    assert resnet.units_per_stage(56, layers_per_unit=(4, 6), family="RevNet") == (3, True)


@pytest.mark.parametrize("call, message", [
    (lambda: revnet.revnet(37), "RevNet depth must be 12n + 2"),
    (lambda: resnet.resnet(33), "ResNet depth must be 6n + 2"),
    (lambda: resnet.resnet("32"), "must be an int"),
    (lambda: revnet.revnet(38, channels=(32, 32, 63, 112)), "even stage widths"),
    (lambda: densenet.densenet_bc(99), "6n + 4"),
    (lambda: densenet.densenet_bc(40, growth_rate=0), "growth_rate"),
])
def test_bad_configurations_say_what_was_expected(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
