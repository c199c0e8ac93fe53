"""Separators, cut profiles, the memory model and Grappler's simulation on graphs small
enough that every figure is worked out by hand in the comments."""

import tensorflow as tf

from memgrad._src.graph import ForwardGraph, cut_profile, single_tensor_separators
from memgrad._src.graph.memory_model import MemoryModel, gradient_reads
from memgrad._src.graph.simulate import simulate_peak

KIB256 = 256 * 256 * 4  # bytes of a float32 [256, 256]


def _traced(build, spec):
    """``build(x)`` (returning ``(y, found)``) traced on a placeholder; ``found``."""
    found = {}

    @tf.function(autograph=False)
    def fn(x):
        y, found["value"] = build(x)
        return y

    fn.get_concrete_function(spec)
    return found["value"]


def _diamond(x):
    """x -> a = tanh -> b = sin(a), c = cos(a) -> d = b + c -> y = sum(d); float32 [2, 3]:
    24 bytes per tensor, 4 for y."""
    a = tf.tanh(x, name="a")
    d = tf.add(tf.sin(a, name="b"), tf.cos(a, name="c"), name="d")
    y = tf.reduce_sum(d, name="y")
    return y, ForwardGraph([y], [x])


def _chain(x):
    """x -> t0 .. t3 = tanh -> y = sum; float32 [256, 256]: 256 KiB per tanh output."""
    h = x
    for i in range(4):
        h = tf.tanh(h, name=f"t{i}")
    y = tf.reduce_sum(h, name="y")
    return y, ForwardGraph([y], [x])


def test_the_separators_of_a_diamond_are_its_two_ends_not_its_branches():
    def build(x):
        y, view = _diamond(x)
        return y, [t.name for t in single_tensor_separators(view)]

    assert _traced(build, tf.TensorSpec([2, 3])) == ["a:0", "d:0", "y:0"]


def test_the_cut_profile_of_a_diamond_counts_what_each_position_leaves_alive():
    def build(x):
        y, view = _diamond(x)
        profile = cut_profile(view)
        return y, ([op.name for op in profile.ops], profile.live.tolist(),
                   [[t.name for t in profile.cut(i)] for i in range(5)])

    ops, live, cuts = _traced(build, tf.TensorSpec([2, 3]))
    assert ops == ["a", "b", "c", "d", "y"]
    # After a: {a}; after b: {a, b} (c still reads a); after c: {b, c}; after d: {d};
    # after y: {y} (an output lives to the end).
    assert live == [24, 48, 48, 24, 4]
    assert cuts == [["a:0"], ["a:0", "b:0"], ["b:0", "c:0"], ["d:0"], ["y:0"]]


def test_gradient_reads_follow_tensorflows_gradient_functions():
    def build(x):
        y, view = _diamond(x)
        return y, {op.type: gradient_reads(op) for op in view.activation_ops}

    reads = _traced(build, tf.TensorSpec([2, 3]))
    assert reads["Tanh"] == (frozenset(), frozenset({0}))   # 1 - tanh^2: its output
    assert reads["Sin"] == (frozenset({0}), frozenset())    # cos(a): its input
    assert reads["Cos"] == (frozenset({0}), frozenset())
    assert reads["AddV2"] == (frozenset(), frozenset())     # reads neither
    assert reads["Sum"] == (frozenset({1}), frozenset())    # its axis (a constant) only


def test_the_memory_model_of_a_chain_by_hand():
    def build(x):
        y, view = _chain(x)
        m = MemoryModel(view)
        return y, dict(saved=m.saved.tolist(), plain=m.predict([]), cut=m.predict([1]),
                       cut_bytes=[m.cut_bytes(p) for p in range(4)],
                       kept=[t.name for t in m.tensors_for([1])],
                       single=m.segment_flops(0, 1), segment=m.segment_flops(-1, 1))

    got = _traced(build, tf.TensorSpec([256, 256]))
    # Each tanh's gradient reads its output; the sum's reads no activation.
    assert got["saved"] == [KIB256] * 4 + [0]
    assert got["cut_bytes"] == [KIB256] * 4
    # Plain backprop: the four saved outputs, plus the widest gradient step, the sum's (its
    # input's gradient and its output's: 256 KiB + 4 bytes); nothing recomputed.
    assert got["plain"] == (4 * KIB256 + KIB256 + 4, 0.0)
    # A cut after t1 keeps t1. Segment t0..t1, recomputed: t0 and t1 saved plus one tanh's
    # gradient step (3 x 256 KiB). The last segment, t2..y: t1 kept, t2 and t3 saved, the
    # sum's step (4 x 256 KiB + 4), the peak. Recomputed: t0 alone, 65,536 FLOPs; t1's
    # gradient reads the kept t1, so the copy of t1 does not run (the rewrite's peel).
    assert got["cut"] == (4 * KIB256 + 4, 256 * 256)
    assert got["kept"] == ["t1:0"]
    assert got["single"] == 0.0  # one op is differentiated in place, not recomputed
    assert got["segment"] == 256 * 256


def test_grappler_simulates_what_is_alive_together():
    @tf.function(autograph=False)
    def concat(x):
        a = tf.tanh(x)
        return tf.reduce_sum(tf.concat([a, a * 2.0], 0))

    @tf.function(autograph=False)
    def one(x):
        return tf.reduce_sum(tf.tanh(x))

    spec = tf.TensorSpec([256, 256])
    for fn, above in ((concat, 4 * KIB256), (one, KIB256 + 4)):
        graph = fn.get_concrete_function(spec).graph
        peak = simulate_peak(graph, graph.outputs)
        # concat: a and a * 2 (256 KiB each) are alive while their concatenation (512 KiB)
        # is made. one: the tanh and the 4-byte sum.
        assert peak.input_bytes == KIB256 and peak.variable_bytes == 0
        assert peak.peak_above_baseline_bytes == above, fn


def test_a_view_of_a_buffer_is_counted_once_and_keeps_its_buffer_alive():
    """t0 = tanh(x); r = reshape(t0) (a view of t0's buffer); t1 = tanh(r); y = sum(t1).
    TanhGrad reads t0 through nothing but t0 itself, and t1; the reshape allocates nothing."""

    def build(x):
        t0 = tf.tanh(x, name="t0")
        r = tf.reshape(t0, [256 * 256], name="r")
        t1 = tf.tanh(r, name="t1")
        y = tf.reduce_sum(t1, name="y")
        view = ForwardGraph([y], [x])
        profile = cut_profile(view)
        m = MemoryModel(view)
        return y, dict(sizes=profile.sizes.tolist(), tensor_sizes=profile.tensor_sizes.tolist(),
                       roots=profile.roots.tolist(), deaths=profile.deaths.tolist(),
                       saved=m.saved.tolist(), plain=m.predict([])[0])

    got = _traced(build, tf.TensorSpec([256, 256]))
    assert got["sizes"] == [KIB256, 0, KIB256, 4]  # t0, r (t0's buffer), t1, y
    assert got["tensor_sizes"] == [KIB256, KIB256, KIB256, 4]
    assert got["roots"] == [0, 0, 2, 3]
    assert got["deaths"][0] == 2  # t0's buffer lives until r's consumer, t1
    assert got["saved"] == [KIB256, 0, KIB256, 0]
    # Two saved buffers plus the sum's gradient step (256 KiB + 4 bytes): as the chain of
    # two tanh without the reshape. Counted as its own tensor, r would add 256 KiB.
    assert got["plain"] == 3 * KIB256 + 4


def test_a_custom_gradient_counts_what_its_function_reads_not_the_ops_inside():
    """a = tanh(x); y = sum(swish(a)), swish(a) = a * sigmoid(a) under tf.custom_gradient
    whose gradient recomputes the sigmoid from a (as TensorFlow's tf.nn.silu does): the
    sigmoid and the product inside are never differentiated, so nothing they would read
    is saved; what the function reads, a, is."""

    @tf.custom_gradient
    def swish(a):
        def grad(dy):
            s = tf.sigmoid(a)
            return dy * s * (1.0 + a * (1.0 - s))
        return a * tf.sigmoid(a), grad

    def build(x):
        a = tf.tanh(x, name="a")
        y = tf.reduce_sum(swish(a), name="y")
        view = ForwardGraph([y], [x])
        m = MemoryModel(view)
        by_type = {}
        for p, op in enumerate(m.profile.ops):
            by_type[op.type] = by_type.get(op.type, 0) + m.saved[p]
        return y, dict(by_type=by_type, plain=m.predict([])[0])

    got = _traced(build, tf.TensorSpec([256, 256]))
    # Saved: a (TanhGrad reads it; the custom gradient reads it too: one buffer). Not the
    # sigmoid nor the product, which TensorFlow never differentiates.
    assert got["by_type"]["Tanh"] == KIB256
    assert got["by_type"].get("Sigmoid", 0) == 0
    assert got["by_type"].get("Mul", 0) == 0
    assert sum(got["by_type"].values()) == KIB256


def test_the_same_computation_twice_is_one_buffer_as_after_grapplers_merge():
    """a = tanh(x); r1 = relu(a), r2 = relu(a) (NASNet's branches do this); y = sum(r1 * r2).
    Grappler merges the two ReLUs before the function runs: one buffer, read by both ReLU
    gradients and by the product's."""

    def build(x):
        a = tf.tanh(x, name="a")
        r1, r2 = tf.nn.relu(a, name="r1"), tf.nn.relu(a, name="r2")
        y = tf.reduce_sum(r1 * r2, name="y")
        profile = cut_profile(ForwardGraph([y], [x]))
        return y, dict(names=[t.op.name for t in profile.tensors], sizes=profile.sizes.tolist(),
                       roots=profile.roots.tolist())

    got = _traced(build, tf.TensorSpec([256, 256]))
    assert got["names"][:3] == ["a", "r1", "r2"]
    assert got["sizes"][:3] == [KIB256, KIB256, 0]  # r2 is r1's buffer
    assert got["roots"][:3] == [0, 1, 1]


def test_a_half_precision_copy_of_a_weight_is_held_from_the_start():
    """a = tanh(x16 @ cast(w0)); h = tanh(a @ cast(w1)), as mixed_float16 Dense layers
    compute: each cast copy (128 KiB) is made when the step starts; the second product's
    gradient for a reads w1's copy (the first's reads only x16, whose gradient is not
    needed). The weights read themselves are no new buffers."""
    w0, w1 = tf.Variable(tf.ones([256, 256])), tf.Variable(tf.ones([256, 256]))

    def build(x):
        a = tf.tanh(tf.matmul(tf.cast(x, tf.float16), tf.cast(w0, tf.float16)), name="a")
        h = tf.tanh(tf.matmul(a, tf.cast(w1, tf.float16)), name="h")
        y = tf.reduce_sum(tf.cast(h, tf.float32), name="y")
        m = MemoryModel(ForwardGraph([y], [w0, w1]))
        return y, m.weight_copy_bytes

    assert _traced(build, tf.TensorSpec([256, 256])) == KIB256 // 2
