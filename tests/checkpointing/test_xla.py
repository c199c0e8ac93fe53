"""Checkpointing under XLA (``jit_compile=True``), the path Keras's `fit` takes on a GPU.

XLA drops control dependencies and merges equal subexpressions, so before the rewrite gated
its recomputation with a data dependency, a checkpointed step compiled with XLA had the same
peak as plain XLA (MobileNetV2: 1.00x). Gradients must equal plain XLA's; peaks are asserted
as ratios to plain XLA's, measured on CPU (XLA's CPU backend allocates through the BFC
allocator the tests read).
"""

import keras
import pytest
import tensorflow as tf

import memgrad
from memgrad.profiler.workloads import residual_chain
from tests.checkpointing.models import max_relative_error, rewritten, transformer
from tests.checkpointing.test_parity import _grouped_conv_model


def _xla_pair(loss_of, variables, checkpoints="memory"):
    """An XLA-compiled step returning (plain gradients, checkpointed gradients)."""

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as plain_tape:
            plain_loss = loss_of(x)
        with memgrad.GradientTape(checkpoints=checkpoints) as tape:
            loss = loss_of(x)
        return plain_tape.gradient(plain_loss, variables), tape.gradient(loss, variables)

    return step


def _residual_chain_case():
    weights, loss_fn = residual_chain(16, 32, seed=3)
    return loss_fn, weights, tf.random.stateless_normal([64, 32], [1, 2])


def _keras_case(build, shape):
    def case():
        model = build()
        x = tf.random.stateless_normal(shape, [3, 4])
        return (lambda x: tf.reduce_sum(model(x, training=True) ** 2)), model.trainable_variables, x
    return case


CASES = {
    "residual chain": _residual_chain_case,
    "transformer": _keras_case(lambda: transformer(blocks=3, dim=16, heads=2, tokens=6)[0], [8, 6, 16]),
    "grouped conv": _keras_case(_grouped_conv_model, [4, 8, 8, 8]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_equal_plain_xla(case):
    keras.utils.set_random_seed(0)
    loss_of, variables, x = CASES[case]()
    step = _xla_pair(loss_of, variables)
    with rewritten():
        plain, checkpointed = step(x)
    assert all(g is not None for g in checkpointed)
    assert max_relative_error(plain, checkpointed) <= 1e-5


# Peaks are measured in fresh processes whose allocator was grown first (see xla_probe.py):
# XLA asks for one large buffer per step, which a fresh BFC allocator rounds up to a power of
# two, and which an allocator with a history places wherever it fits.
FRESH_PROCESSES = {
    key: dict(target="tests.checkpointing.xla_probe:measure", args=[cases],
              env={"TF_CPU_ALLOCATOR_USE_BFC": "true"}, timeout=400,
              expected_s=60 * len(cases))  # wall time in CI's memory pass (conftest.py: longest first)
    for key, cases in (("tapes", ["chain", "transformer", "recompute"]),
                       # One process each: after one fit, the freed chunks of its step can be
                       # handed out whole to the next (measured 0.43x instead of 0.36x).
                       ("fit 1", ["fit: enable then compile"]), ("fit 2", ["fit: compile then enable"]))
}


@pytest.fixture(scope="module")
def xla_results(fresh_results):
    return {case: result for results in fresh_results.values() for case, result in results.items()}


def _ratio(result, name):
    plain, checkpointed = result["plain"], result["memgrad"]
    print(f"{name} under XLA: plain {plain / 2**20:.1f} MiB, memgrad {checkpointed / 2**20:.1f} MiB, "
          f"ratio {checkpointed / plain:.3f}")
    return checkpointed / plain


@pytest.mark.memory
def test_residual_chain_saving_holds_under_xla(xla_results):
    """64 layers h <- h + relu(h W), batch 1024 x 128: was 1.00x of plain XLA before the gate."""
    assert _ratio(xla_results["chain"], "residual chain") <= 0.3


@pytest.mark.memory
def test_twelve_layer_transformer_saving_holds_under_xla(xla_results):
    """12 blocks, 16 x 64 tokens x 64 features: was 1.00x of plain XLA before the gate."""
    assert _ratio(xla_results["transformer"], "transformer") <= 0.4


@pytest.mark.memory
def test_recompute_saving_holds_under_xla(xla_results):
    """memgrad.recompute around each of 16 four-layer residual blocks."""
    assert _ratio(xla_results["recompute"], "recompute") <= 0.3


@pytest.mark.memory
@pytest.mark.parametrize("order", ["enable then compile", "compile then enable"])
def test_fit_keeps_xla_and_the_saving(xla_results, order):
    """`fit` with compile(jit_compile=True), in either order: jit_compile stays True, nothing
    warns, the step is rewritten, two steps equal plain XLA's (1e-5) and the peak is at most
    half of plain XLA's."""
    result = xla_results[f"fit: {order}"]
    assert result["jit_compile"] == [True, True]
    assert result["warnings"] == []
    assert result["rewrites"] and min(result["rewrites"]) >= 2
    assert result["step_scale"] > 0
    assert result["step_error"] <= 1e-5
    assert _ratio(result, f"fit ({order})") <= 0.5


def test_the_rewrite_sees_whether_it_is_traced_for_xla():
    """The data gates (a copy of each port) are added only where XLA would drop the control
    dependencies: in a function traced with jit_compile=True, or nested in one."""
    from memgrad._src import tf_internals

    seen = []

    def probe(label):
        seen.append((label, tf_internals.graph_or_parents_in_xla_context(tf.compat.v1.get_default_graph())))

    @tf.function
    def nested(x):
        probe("nested in XLA")
        return x

    @tf.function(jit_compile=True)
    def compiled(x):
        probe("XLA")
        return nested(x)

    @tf.function
    def plain(x):
        probe("plain")
        return x

    compiled(tf.ones([1]))
    plain(tf.ones([1]))
    assert seen == [("XLA", True), ("nested in XLA", True), ("plain", False)]
