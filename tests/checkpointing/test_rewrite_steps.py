"""The rewrite's steps, one at a time, on a chain small enough to check by hand:

    x -> tanh -> sin = b (kept) -> tanh -> sin = d (kept) -> tanh -> sum = y

With b and d kept, the last segment (d to y) is differentiated on the original ops; the
segment from b to d (two ops) is copied behind a gate and differentiated; the one from x to
b (two ops) likewise; the parts reach x.
"""

import functools

import numpy as np
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing.aggregate import GradientParts
from memgrad._src.checkpointing.rewrite import _Rewrite
from memgrad._src.graph.view import ForwardGraph

GRADIENTS = functools.partial(tf_internals.tf_gradients_v1, unconnected_gradients="none")
X = tf.constant(np.linspace(-1.0, 1.0, 6).reshape(2, 3), tf.float32)


def _in_chain(check):
    """Runs ``check(rewrite, tensors)`` in a traced chain and returns what it returns.
    ``tensors``: the chain's x, b, d, y, and ``reference``, tf.gradients' dy/dx."""

    @tf.function(autograph=False)  # memgrad calls the rewrite from TensorFlow's own code
    def fn(x):
        b = tf.sin(tf.tanh(x), name="b")
        d = tf.sin(tf.tanh(b), name="d")
        y = tf.reduce_sum(tf.tanh(d), name="y")
        tensors = dict(x=x, b=b, d=d, y=y, reference=tf.gradients(y, x)[0])
        rewrite = _Rewrite(ForwardGraph([y], [x]), [b, d], GRADIENTS, {})
        return check(rewrite, tensors)

    return fn(X)


def test_select_keeps_the_checkpoints_given_and_not_the_input():
    def check(rewrite, t):
        kept = {ref.deref().name for ref in rewrite.checkpoints}
        assert kept == {t["b"].name, t["d"].name}, kept
        return tf.constant(0)

    _in_chain(check)


def test_levels_order_the_checkpoints_inputs_first_with_the_ops_between_them():
    def check(rewrite, t):
        levels = rewrite.levels()
        assert levels == [[t["b"].ref()], [t["d"].ref()]]
        segment = {op.type for op in rewrite._segment_ops[t["d"].ref()]}
        assert segment == {"Tanh", "Sin"} and len(rewrite._segment_ops[t["d"].ref()]) == 2
        return tf.constant(0)

    _in_chain(check)


def test_the_last_segment_gives_the_last_checkpoint_its_gradient_on_the_original_ops():
    def check(rewrite, t):
        parts = GradientParts(rewrite)
        rewrite.last_segment([None], parts)
        assert set(parts.kept) == {t["d"].ref()} and not parts.x_parts
        assert rewrite.copied_ops == 0 and rewrite.segments == 1
        # dy/dd = 1 - tanh(d)^2, from the original d.
        return parts.kept[t["d"].ref()][0], 1.0 - tf.square(tf.tanh(t["d"]))

    got, expected = _in_chain(check)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_the_gate_is_the_incoming_gradients_then_the_previous_copys():
    incoming = {"d": tf.constant([1.0]), "sparse": tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]))}

    class Kept:
        def __init__(self, key):
            self.key = key

        def ref(self):
            return self.key

    previous = [[tf.constant([2.0])]]  # the dense parts of each gradient the last copy made
    gate = _Rewrite.gate_for([Kept("d"), Kept("sparse")], incoming, previous)
    expected = [incoming["d"], incoming["sparse"].values, incoming["sparse"].indices, previous[0][0]]
    assert len(gate) == 4 and all(g is x for g, x in zip(gate, expected))


def test_copy_makes_the_segments_ops_again_reading_the_checkpoint_through_a_gated_port():
    def check(rewrite, t):
        wait = tf.ones_like(t["d"], name="incoming")
        rewrite.levels()  # finds each checkpoint's segment
        ops = rewrite._segment_ops[t["d"].ref()]
        mapping, ports = rewrite.copy(ops, [wait])
        assert rewrite.copied_ops == 2
        copied_d = mapping[t["d"].ref()]
        assert copied_d is not t["d"] and copied_d.op.type == "Sin"
        assert [original is t["b"] for original, _ in ports] == [True]
        port = ports[0][1]
        assert port.op.type == "Identity" and wait.op in port.op.control_inputs
        return copied_d, t["d"]

    copied, original = _in_chain(check)
    np.testing.assert_array_equal(copied, original)  # the same values, computed again


def test_a_copy_behind_several_gradients_waits_for_them_through_one_op():
    """p ports behind q gradients take p + q control edges, not p x q (a 1,024-layer chain's
    'memory' rewrite had 80,000 of them, which Grappler and the first run walked)."""

    def check(rewrite, t):
        waits = [tf.ones_like(t["d"], name=f"incoming_{i}") for i in range(5)]
        rewrite.levels()
        ops = rewrite._segment_ops[t["d"].ref()]
        mapping, ports = rewrite.copy(ops, waits)
        (port,) = [port for _, port in ports]
        (barrier,) = port.op.control_inputs
        assert barrier.type == "NoOp" and set(barrier.control_inputs) == {w.op for w in waits}
        copied = [mapping[t["d"].ref()].op, mapping[t["d"].ref()].op.inputs[0].op]
        assert all(len(op.control_inputs) <= 1 for op in copied)
        return mapping[t["d"].ref()], t["d"]

    copied, original = _in_chain(check)
    np.testing.assert_array_equal(copied, original)


def test_a_level_carries_its_gradient_back_to_the_checkpoint_before_it():
    def check(rewrite, t):
        parts = GradientParts(rewrite)
        rewrite.last_segment([None], parts)
        levels = rewrite.levels()
        previous = rewrite.differentiate_level(levels[1], parts, [])
        assert set(parts.kept) == {t["d"].ref(), t["b"].ref()} and len(previous) == 1
        assert rewrite.copied_ops == 2 and rewrite.segments == 2
        expected = tf.gradients(t["y"], t["b"])[0]
        return parts.kept[t["b"].ref()][0], expected

    got, expected = _in_chain(check)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_every_step_in_turn_gives_plain_backprops_gradient():
    def check(rewrite, t):
        (grad,) = rewrite.run([None])
        assert rewrite.copied_ops == 4 and rewrite.segments == 3
        return grad, t["reference"]

    got, expected = _in_chain(check)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_parts_are_filed_by_checkpoint_or_x_and_summed_per_x():
    def check(rewrite, t):
        parts = GradientParts(rewrite)
        parts.route(t["x"], tf.ones_like(t["x"]))
        parts.route(t["x"], 2.0 * tf.ones_like(t["x"]))
        parts.route(t["y"], tf.ones_like(t["y"]))  # neither kept nor an x: dropped
        parts.route(t["b"], None)  # no gradient: nothing filed
        assert not parts.kept and len(parts.x_parts[t["x"].ref()]) == 2
        (total,) = parts.results()
        return total

    np.testing.assert_array_equal(_in_chain(check), 3.0 * np.ones((2, 3)))


def test_copies_no_gradient_reads_are_counted_as_copied_not_recomputed():
    # x @ w1 -> tanh -> @ w2 = kept -> tanh -> sum. The kept product's segment copies the
    # first product, the tanh and the kept product itself; MatMul's gradient reads its
    # inputs, not its output, so the copied second product feeds nothing and is pruned.
    import memgrad

    w1 = tf.Variable(tf.eye(3))
    w2 = tf.Variable(tf.ones([3, 3]))

    @tf.function
    def fn(x):
        kept = tf.matmul(tf.tanh(tf.matmul(x, w1)), w2)
        return memgrad.gradients(tf.reduce_sum(tf.tanh(kept)), [w1, w2], checkpoints=[kept])

    with memgrad.record_rewrites() as log:
        fn(X)
    assert (log[0].copied_ops, log[0].recomputed_ops) == (3, 2), log[0]


def test_the_first_copy_waits_for_the_last_segments_weight_gradient():
    """A weight gradient of the last segment is needed by no other gradient: left to the
    executor, it can run after the copies and hold what it reads (the activation it is
    computed from) through them. A two-block GPT-2 at Budget(0.6), one inter-op thread,
    ran it last in 3 fresh processes of 24: 6.34 MiB requested at the peak, against 5.34
    in the others and the model's 4.58. The first copy waits for it."""
    w = tf.constant([0.5, -1.0, 2.0])

    @tf.function(autograph=False)
    def fn(x, w):
        b = tf.sin(tf.tanh(x), name="b")
        d = tf.sin(tf.tanh(b), name="d")
        y = tf.reduce_sum(tf.tanh(d) * w, name="y")
        rewrite = _Rewrite(ForwardGraph([y], [x, w]), [b, d], GRADIENTS, {})
        parts = GradientParts(rewrite)
        previous = rewrite.last_segment([None], parts)
        (dw,) = parts.x_parts[w.ref()]
        assert [len(p) for p in previous] == [1] and previous[0][0] is dw, previous
        dx, dw = rewrite.run([None])  # again, from the start: the whole rewrite
        (port,) = [op for op in tf.compat.v1.get_default_graph().get_operations()
                   if op.type == "Identity" and op.name.split("/")[-1].startswith("port")
                   and op.inputs[0].name == b.name]
        (barrier,) = port.control_inputs
        assert dw.op in barrier.control_inputs, [op.name for op in barrier.control_inputs]
        return dx, dw, tf.gradients(y, [x, w])

    dx, dw, (expected_dx, expected_dw) = fn(X, w)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-6)
    np.testing.assert_allclose(dw, expected_dw, rtol=1e-6)
