"""TF1-style users: reference variables, Session graphs, collections and tf_keras.

`tf.compat.v1.disable_v2_behavior()` is process-wide, so the behaviours run in one fresh
process (`tests/checkpointing/tf1_session_probe.py`, started by tests/conftest.py) and this
module checks its report. Importing the probe here would turn v2 behaviour off in this process.
"""

import pytest

# The probe takes a minute or more; the chain's peaks are measured memory.
pytestmark = pytest.mark.slow
# expected_s: wall time in CI's memory pass (the longest start first: conftest.py).
FRESH_PROCESSES = {"report": dict(target="tests.checkpointing.tf1_session_probe:report", timeout=600,
                                  expected_s=60)}


@pytest.fixture(scope="module")
def report(fresh_results):
    return fresh_results["report"]


@pytest.mark.memory
@pytest.mark.parametrize("n, limit", [(25, 0.6), (100, 0.4)])
def test_reference_variable_chain_saves_memory_in_a_session(report, n, limit):
    # The input is a variable too: the chain is still told apart from parameter arithmetic.
    # Measured 0.43x at n=25 and 0.33x at n=100 (the weights' gradients, 0.25 MiB per
    # layer, are part of both peaks).
    chain = report[f"chain_{n}"]
    assert chain["error"] <= 1e-5
    assert chain["calls"] == 1 and chain["segments"] > 1
    assert chain["memory_bytes"] <= limit * chain["plain_bytes"]


def test_monkey_patch_with_collections_in_a_session(report):
    patched = report["patched_collection"]
    assert patched["calls"] == 1 and patched["segments"] > 1 and patched["checkpoints"] == 4
    assert patched["error"] <= 1e-5


def test_tf_keras_trains_through_the_patch(report):
    fit = report["tf_keras"]
    assert fit["calls"] >= 1 and fit["segments"] > 1, "tf_keras did not call memgrad"
    assert fit["patched_loss"] == pytest.approx(fit["plain_loss"], rel=1e-5)
    assert fit["weight_error"] <= 1e-5
