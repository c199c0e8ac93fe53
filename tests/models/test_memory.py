"""Training-step memory of the zoo: a Glow level does not grow with K; DenseNet-BC grows linearly.

Measured in fresh processes (FRESH_PROCESSES, started by tests/conftest.py) with BFC and oneDNN's convolutions:
TensorFlow's own (Eigen) CPU convolution gradients add an im2col scratch of up to 16 MiB per
convolution in flight, the same for every variant, which would bury these small models'
feature maps (a 16-layer DenseNet-BC measured 76 MiB with it, 9 MiB without).
"""

import pytest

pytestmark = pytest.mark.memory

CONFIGS = {"densenet": ["40:1", "100:1", "100:0"], "glow": ["4:1", "16:1", "16:0"]}
FRESH_PROCESSES = {  # expected_s: wall time in CI's memory pass (conftest.py)
    kind: dict(target=f"tests.models.memory_probe:{kind}", args=[configs],
               env={"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPU_ALLOCATOR_USE_BFC": "true"},
               expected_s={"densenet": 100, "glow": 80}.get(kind, 0))
    for kind, configs in CONFIGS.items()
}


@pytest.fixture(scope="module")
def peaks(fresh_results):
    return fresh_results


def test_glow_level_peak_does_not_grow_with_steps(peaks):
    glow = peaks["glow"]
    # Measured (oneDNN, BFC): K=4, 16, 32 reversible 14.9, 13.8, 11.8 MiB; plain K=16 48.4 MiB
    # (3.5x), K=32 87.9 MiB (7.5x). K=16 shows it with half the steps to trace and run.
    shallow, deep = glow["4:1"], glow["16:1"]
    assert shallow > 0
    assert deep <= 1.2 * shallow, f"K=16: {deep / 2**20:.2f} MiB vs K=4: {shallow / 2**20:.2f} MiB"
    # The same level trained by plain backprop stores every step's activations.
    assert glow["16:0"] >= 2.5 * deep, f"plain K=16: {glow['16:0'] / 2**20:.2f} MiB"


def test_efficient_densenet_is_at_most_half_of_plain_at_depth_100(peaks):
    densenet = peaks["densenet"]
    efficient, plain = densenet["100:1"], densenet["100:0"]
    assert efficient <= 0.5 * plain, f"{efficient / 2**20:.1f} vs {plain / 2**20:.1f} MiB"


def test_efficient_densenet_grows_about_linearly_with_depth(peaks):
    """From 36 to 96 dense layers (2.67x), the efficient peak grows at most 1.25 x 2.67 times."""
    densenet = peaks["densenet"]
    growth = densenet["100:1"] / densenet["40:1"]
    assert growth <= 1.25 * (96 / 36), f"x{growth:.2f} from depth 40 to 100"
