"""The forward-graph view: bytes, FLOPs, activations, separators and cuts."""

import tensorflow as tf

from memgrad._src.graph import ForwardGraph, cut_profile, op_flops, single_tensor_separators
from memgrad._src.graph import tensor_bytes


def _trace(fn, *specs):
    """Run `fn` on graph placeholders inside a tf.function; return what it returns."""
    found = {}

    @tf.function
    def traced(*args):
        found["value"] = fn(*args)
        return 0

    traced.get_concrete_function(*specs)
    return found["value"]


def test_bytes_and_flops_from_static_shapes():
    def build(x, kernel):
        a = tf.matmul(x, tf.ones([32, 16]))
        b = tf.nn.conv2d(tf.ones([2, 8, 8, 3]), kernel, 1, "SAME")
        return (tensor_bytes(a), op_flops(a.op), tensor_bytes(b), op_flops(b.op),
                op_flops(tf.tanh(a).op), tensor_bytes(x, unknown_dim=10))

    got = _trace(build, tf.TensorSpec([4, 32]), tf.TensorSpec([3, 3, 3, 5]))
    matmul_bytes, matmul_flops, conv_bytes, conv_flops, tanh_flops, unknown = got
    assert matmul_bytes == 4 * 16 * 4
    assert matmul_flops == 2 * 4 * 16 * 32
    assert conv_bytes == 2 * 8 * 8 * 5 * 4
    assert conv_flops == 2 * (2 * 8 * 8 * 5) * (3 * 3 * 3)
    assert tanh_flops == 4 * 16
    assert tensor_bytes(tf.zeros([3, 5], tf.float16)) == 30
    assert unknown == 4 * 32 * 4  # fully known shape: unknown_dim unused


def test_activations_exclude_parameter_arithmetic():
    w = tf.Variable(tf.ones([8, 8]))

    def build(x):
        h = tf.tanh(x @ w)
        decay = tf.reduce_sum(w * w)  # parameters alone: not an activation
        loss = tf.reduce_sum(h) + decay
        view = ForwardGraph([loss], [w])
        return view.is_activation(h), view.is_activation(decay), view.is_forward(decay.op)

    h_is, decay_is, decay_forward = _trace(build, tf.TensorSpec([4, 8]))
    assert h_is and decay_forward and not decay_is


def test_separators_of_a_residual_chain_and_cuts_of_a_skip():
    weights = [tf.Variable(tf.ones([8, 8]) * 0.1) for _ in range(4)]

    def build(x):
        h, sums = x, []
        for w in weights:
            h = h + tf.nn.relu(h @ w)
            sums.append(h)
        skip = tf.tanh(sums[0] @ weights[0])  # lives across the rest of the chain
        loss = tf.reduce_sum(h * skip)
        view = ForwardGraph([loss], weights)
        separators = {t.name for t in single_tensor_separators(view)}
        profile = cut_profile(view)
        return separators, [t.name for t in sums], skip.name, profile

    separators, sums, skip, profile = _trace(build, tf.TensorSpec([4, 8]))
    # The first residual sum feeds both the chain and the skip: it separates; later sums
    # are bypassed by the skip and do not.
    assert sums[0] in separators
    assert not (set(sums[1:]) & separators)
    # Every cut after the skip's producer holds the skip and is counted in live bytes.
    position = next(i for i, op in enumerate(profile.ops) if op.name == skip.split(":")[0])
    later = list(range(position, len(profile.ops) - 2))
    assert later and all(skip in {t.name for t in profile.cut(i)} for i in later)
    assert all(profile.live[i] >= 4 * 8 * 4 for i in later)
    assert profile.produced[-1] == sum(profile.sizes)


def _walks(walk):
    """``walk(view, a, c)`` traced on ``c = sin(a) + a``, ``a = tanh(x @ w)``: what it returns."""
    def build(x, w):
        a = tf.tanh(x @ w, name="a")
        c = tf.add(tf.sin(a, name="b"), a, name="c")
        loss = tf.reduce_sum(tf.cos(c), name="loss")
        return walk(ForwardGraph([loss], [w]), a, c)

    return _trace(build, tf.TensorSpec([2, 3]), tf.TensorSpec([3, 3]))


def _names(ops):
    return sorted(op.name for op in ops)


def test_walk_back_copies_the_ops_between_the_seeds_and_the_stop_tensors():
    def walk(view, a, c):
        ops, met = view.walk_back([c.op], {a.ref()})
        everything, _ = view.walk_back([c.op], set())
        return _names(ops), [t.name for t in met.values()], _names(everything)

    ops, met, everything = _walks(walk)
    assert ops == ["b", "c"] and met == ["a:0"]  # stops at a, met once though read twice
    assert everything == ["a", "b", "c", "matmul"]  # back to the inputs, never copied


def test_walk_back_gives_up_when_asked_and_only_then():
    def walk(view, a, c):
        asked = []

        def never(op, seen):
            asked.append((op.name, len(seen)))
            return False

        kept = view.walk_back([c.op], {a.ref()}, never)
        past_two = view.walk_back([c.op], set(), lambda op, seen: len(seen) >= 2)
        at_a_product = view.walk_back([c.op], set(), lambda op, seen: op.type == "MatMul")
        short = view.walk_back([c.op], {a.ref()}, lambda op, seen: op.type == "MatMul")
        return _names(kept[0]), sorted(asked), past_two, at_a_product, short and _names(short[0])

    kept, asked, past_two, at_a_product, short = _walks(walk)
    assert kept == ["b", "c"]  # a hook that never gives up changes nothing
    assert asked == [("b", 1), ("c", 0)]  # asked once per op, before it joins the walk
    assert past_two is None and at_a_product is None  # the walk reached a third op, a product
    assert short == ["b", "c"]  # stopped at a before the product
