"""Half precision is right on the CPU running the suite: every public layer computes float16,
bfloat16 and mixed_float16 outputs and gradients within half-precision rounding of the same
layer in float32, and the kernel check records which of TensorFlow's half-precision products
are right here.

The layers come from the layer contract's table (every public Keras layer memgrad ships).
The float32 reference gets the half layer's own rounded weights and inputs, so what remains
is the rounding of the half computation itself. Tolerances are in units of roundoff ``u``
(float16 2^-11, bfloat16 2^-8) on the relative (Frobenius) error: a right kernel measured at
most a few units here; TensorFlow's wrong oneDNN float16 einsum on AVX512-FP16 CPUs is off by
more than 1, about 2,500 units, which these tests catch on such a CPU.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad import layers as M
from memgrad import selective as S
from memgrad._src.profiler.kernel_check import UNIT_ROUNDOFF
from tests.test_layer_contract import CASES, _bijector, _dense

# Which kernels compute these depends on oneDNN's state: CI's flipped pass runs them too.
pytestmark = pytest.mark.numerics

CONFIGS = ("float16", "bfloat16", "mixed_float16")
COMPUTE_DTYPE = {"float16": "float16", "bfloat16": "bfloat16", "mixed_float16": "float16"}
# Relative error bounds, in units of roundoff of the compute dtype. Measured on an Intel Ice
# Lake Xeon, oneDNN on and off (the same figures): outputs at most 1.7 units, gradients at
# most 4.7 but Conv3D's kernel gradient (sums of 128 half-precision products) 18.9; stacks,
# which rebuild their activations through several blocks, at most 1.5 and 4.3.
OUTPUT_UNITS, GRADIENT_UNITS = 32, 64
STACK_UNITS = 128
# Stacks whose inverses run in the compute dtype, beside the contract's cases: the Glow flow
# step (ActNorm, 1x1 convolution, affine coupling) and an ellipsis EinsumDense.
EXTRA_CASES = {
    "flow stack, invertible in the compute dtype": (
        lambda dtype: M.ReversibleSequence([M.ActNorm(), M.Invertible1x1Conv(seed=0),
                                            M.AffineCoupling(_dense(3, 3), _dense(3, 4))],
                                           invertible_dtype=dtype), (4, 4, 6)),
    "flow stack": (lambda dtype: M.ReversibleSequence(
        [M.ActNorm(), M.Invertible1x1Conv(seed=1), M.AdditiveCoupling(_dense(3, 5), _dense(3, 6))]), (4, 4, 6)),
    "EinsumDense with an ellipsis": (
        lambda dtype: S.EinsumDense("...b,bc->...c", output_shape=5, bias_axes="c"), (3, 6)),
    "BijectorBlock": (lambda dtype: _bijector(), (6,)),
}


@contextlib.contextmanager
def _global_policy(name):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _make(name, config):
    if name in EXTRA_CASES:
        make, shapes = EXTRA_CASES[name]
        return (lambda: make(COMPUTE_DTYPE[config] if config else "float32")), shapes
    return CASES[name]


def _inputs(name, shapes, compute_dtype):
    """The same inputs for both layers: integers for an embedding, else normal draws rounded
    to ``compute_dtype`` (the float32 reference gets the rounded values)."""
    rng = np.random.default_rng(1)
    if name == "Embedding":
        return [tf.constant(rng.integers(0, 10, size=(2,) + shapes))]
    shapes = shapes if isinstance(shapes, list) else [shapes]
    return [tf.cast(tf.cast(rng.standard_normal((2,) + s), compute_dtype), tf.float32) for s in shapes]


def _first(outputs):
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def _call(layer, xs, weights):
    """``(output, gradients of a fixed linear loss w.r.t. the float inputs and ``weights``)``,
    eagerly under a tape (the path on which selective layers run their own backward)."""
    floats = [x for x in xs if x.dtype.is_floating]
    with tf.GradientTape() as tape:
        tape.watch(floats)
        y = tf.cast(_first(layer(xs if len(xs) > 1 else xs[0])), tf.float32)
        probe = tf.cast(tf.random.stateless_normal(tf.shape(y), seed=[3, 4]), tf.float32)
        loss = tf.reduce_sum(y * probe)
    return y, tape.gradient(loss, floats + list(weights))


def _relative(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _pair(name, config):
    """The layer under ``config`` and a float32 one with the same (rounded) weights, built on
    the same inputs; returns ``(half, reference, half inputs, reference inputs)``."""
    keras.utils.set_random_seed(0)
    compute = COMPUTE_DTYPE[config]
    make, shapes = _make(name, config)
    xs = _inputs(name, shapes, compute)
    half_xs = [x if not x.dtype.is_floating else tf.cast(x, compute) for x in xs]
    with _global_policy(config):
        half = make()
        half(half_xs if len(half_xs) > 1 else half_xs[0])
    reference = _make(name, None)[0]()
    reference(xs if len(xs) > 1 else xs[0])
    assert len(half.weights) == len(reference.weights)
    for ours, theirs in zip(half.weights, reference.weights):
        if not theirs.dtype.startswith("float"):
            continue
        rounded = tf.cast(tf.cast(theirs.value, compute), tf.float32)
        theirs.assign(rounded)
        ours.assign(tf.cast(rounded, ours.dtype))
    return half, reference, half_xs, xs


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", sorted(set(CASES) - {"BijectorBlock"}) + sorted(EXTRA_CASES))
def test_half_precision_matches_float32_with_the_same_weights(name, config):
    half, reference, half_xs, xs = _pair(name, config)
    got, got_grads = _call(half, half_xs, half.trainable_weights)
    want, want_grads = _call(reference, xs, reference.trainable_weights)
    u = UNIT_ROUNDOFF[COMPUTE_DTYPE[config]]
    stack = isinstance(half, M.ReversibleSequence)
    output_bound = (STACK_UNITS if stack else OUTPUT_UNITS) * u
    gradient_bound = (STACK_UNITS if stack else GRADIENT_UNITS) * u
    assert np.all(np.isfinite(got.numpy()))
    error = _relative(got, want)
    assert error <= output_bound, f"{name} under {config}: output off by {error:.3g} (> {output_bound:.3g})"
    assert len(got_grads) == len(want_grads)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert (g is None) == (w is None), f"{name} under {config}: gradient {i} is None on one side only"
        if w is None:
            continue
        g = tf.convert_to_tensor(g)
        w = tf.convert_to_tensor(w)
        error = _relative(g, w)
        assert error <= gradient_bound, (f"{name} under {config}: gradient {i} off by {error:.3g} "
                                         f"(> {gradient_bound:.3g})")


@pytest.mark.parametrize("config", CONFIGS)
def test_ellipsis_einsum_dense_in_a_graph_computes_without_the_ellipsis(config):
    """Inside tf.function the selective EinsumDense runs Keras's computation, ellipsis spelled out."""
    half, reference, half_xs, xs = _pair("EinsumDense with an ellipsis", config)

    @tf.function
    def run(layer, x):
        return _call(layer, [x], layer.trainable_weights)

    got, got_grads = run(half, half_xs[0])
    want, want_grads = run(reference, xs[0])
    graph = run.get_concrete_function(half, half_xs[0]).graph
    equations = [op.get_attr("equation").decode() for op in graph.get_operations() if op.type == "Einsum"]
    assert not any("..." in e for e in equations), equations
    u = UNIT_ROUNDOFF[COMPUTE_DTYPE[config]]
    assert _relative(got, want) <= OUTPUT_UNITS * u
    for g, w in zip(got_grads, want_grads):
        assert _relative(g, w) <= GRADIENT_UNITS * u


def test_invertible_1x1_conv_builds_in_bfloat16():
    layer = M.Invertible1x1Conv(seed=0, dtype="bfloat16")
    y = layer(tf.ones([2, 4, 4, 3], "bfloat16"))
    assert layer.kernel.dtype == "bfloat16" and y.dtype == tf.bfloat16
    kernel = tf.cast(layer.kernel.value, tf.float32)
    np.testing.assert_allclose(tf.matmul(kernel, kernel, transpose_a=True), np.eye(3), atol=0.02)


# The products memgrad's own layers run in half precision (Invertible1x1Conv: a 2-D matmul of
# a reshape; the selective EinsumDense: an einsum without an ellipsis; Dense: matmul).
RELIED_ON = ("matmul 2-D", "matmul 2-D of a reshape", "einsum 'abc,cd->abd'", "einsum 'abcd,de->abce'")


def test_half_precision_kernels_on_this_machine(record_property, capsys):
    """Records which of TensorFlow's half-precision products are right on this CPU (shown with
    ``pytest -rA``, and printed by CI before its tests); the products memgrad relies on must
    be, and a wrong one is named by the check's warning."""
    check = memgrad.profiler.check_half_precision_kernels()
    with capsys.disabled():
        print()
        print(check)
    record_property("cpu", check.cpu)
    record_property("onednn", check.onednn)
    for result in check.results:
        record_property(f"{result.op} {result.dtype} {result.shapes}", result.relative_error)
    assert check.onednn == memgrad.profiler.onednn_enabled()
    assert {r.dtype for r in check.results} == {"float16", "bfloat16"}
    assert any(r.op == "einsum '...i,ij->...j'" and r.dtype == "float16" for r in check.results)
    wrong_relied_on = [str(r) for r in check.wrong if r.op in RELIED_ON]
    assert not wrong_relied_on, f"a product memgrad computes with is wrong on this CPU: {wrong_relied_on}"
    if check.wrong:
        for result in check.wrong:
            assert result.op in check.warning()
    else:
        assert check.warning() is None
    assert check is memgrad.profiler.check_half_precision_kernels()  # once per process


def test_the_check_flags_a_wrong_product(monkeypatch):
    """A product off by its own size is reported wrong and named in the warning."""
    from memgrad._src.profiler import kernel_check

    probes = kernel_check._probes

    def with_a_wrong_one():
        return probes() + [("einsum, made wrong", "ij,jk->ik", ([4, 8], [8, 8]),
                            lambda a, b: 2.0 * tf.cast(tf.matmul(a, b), a.dtype))]

    monkeypatch.setattr(kernel_check, "_probes", with_a_wrong_one)
    check = kernel_check._check.__wrapped__(memgrad.profiler.onednn_enabled())
    wrong = [r for r in check.wrong if r.op == "einsum, made wrong"]
    assert [r.dtype for r in wrong] == ["float16", "bfloat16"]
    assert all(r.relative_error > 0.5 for r in wrong)
    assert "einsum, made wrong in float16" in check.warning()
    assert "TF_ENABLE_ONEDNN_OPTS=0" in check.warning()


def test_a_half_precision_model_is_recognised():
    from memgrad.cli.sweep import computes_in_half_precision

    with _global_policy("mixed_float16"):
        mixed = keras.Sequential([keras.Input((4,)), keras.Sequential([keras.layers.Dense(3)])])
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert computes_in_half_precision(mixed)
    assert not computes_in_half_precision(plain)



def test_memgrad_profile_names_a_wrong_kernel_for_a_half_precision_model():
    """memgrad-profile adds the check (and its warning, if a product is wrong here) to its report
    only when a profiled model computes in half precision."""
    from memgrad.cli.report import half_precision_kernels
    from memgrad.profiler import KernelCheck, KernelResult

    wrong = KernelResult("einsum '...i,ij->...j'", "float16", ((4, 8), (8, 8)), 1.3, 0.0078)
    right = KernelResult("matmul 2-D", "float16", ((64, 8), (8, 8)), 2e-4, 0.0078)
    check = KernelCheck("Intel(R) Xeon(R) Platinum 8480+", ("avx512f", "avx512_fp16", "amx_tile"), True, "2.21.0",
                        (wrong, right))
    assert half_precision_kernels([{"half_precision": False}], check) == (None, None)
    found, warning = half_precision_kernels([{"half_precision": False}, {"half_precision": True}], check)
    assert found["onednn"] is True and [r["right"] for r in found["results"]] == [False, True]
    assert "einsum '...i,ij->...j' in float16" in warning and "matmul 2-D in float16" not in warning
    assert "Platinum 8480+" in warning and "TF_ENABLE_ONEDNN_OPTS=0" in warning
    all_right = KernelCheck("AMD EPYC", ("avx512f",), True, "2.21.0", (right,))
    assert half_precision_kernels([{"half_precision": True}], all_right)[1] is None
