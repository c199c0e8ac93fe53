"""A kept tensor whose op's gradient reads only that tensor (a ReLU, a softmax) is
differentiated on the original op: its segment's copy does not run that op, nor the product
before it, which nothing else needs.

Which copies run is read from the rewritten graph: the ops under the rewrite's ``recompute``
scopes that the function's outputs depend on (TensorFlow prunes the others before a step).
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import memgrad

_COPY = re.compile(r"(.*/)?recompute(_\d+)?/[^/]+")


def _copies_that_run(concrete):
    graph = concrete.graph
    needed, stack = set(), [t.op for t in graph.outputs] + list(graph.control_outputs)
    while stack:
        op = stack.pop()
        if op not in needed:
            needed.add(op)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op in needed and _COPY.fullmatch(op.name)]


def _relu_chain(depth=12, width=32):
    weights = [tf.Variable(tf.random.stateless_normal([width, width], [3, i]) / width ** 0.5)
               for i in range(depth)]
    relus = []

    def loss(x):
        h = x
        relus.clear()
        for w in weights:
            h = tf.nn.relu(h @ w)
            relus.append(h)
        return tf.reduce_sum(h * h)

    return weights, loss, relus


def test_a_segment_ending_at_a_relu_does_not_run_its_last_product_again():
    weights, loss, relus = _relu_chain()
    x = tf.random.stateless_normal([16, 32], [3, 99])

    @tf.function
    def memgrad_step(x):  # loss(x) runs first and fills `relus` with this graph's ReLUs
        return memgrad.gradients(loss(x), weights, checkpoints=[relus[3], relus[7]])

    @tf.function
    def plain_step(x):
        return tf.gradients(loss(x), weights)

    # Segments x -> relu 3 and relu 3 -> relu 7 are recomputed: products 0-2 and 4-6 run
    # again, not 3 and 7, whose ReLUs' gradients read the kept outputs.
    products = [op for op in _copies_that_run(memgrad_step.get_concrete_function(x)) if op.type == "MatMul"]
    assert len(products) == 6, [op.name for op in products]
    for got, want in zip(memgrad_step(x), plain_step(x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_the_record_counts_the_flops_of_the_copies_that_run():
    """`RewriteRecord.recomputed_flops` is what the copies that run compute: on the ReLU chain
    above, products 0-2 and 4-6 and their ReLUs (16x32 rows through 32x32 weights), not the
    whole segments; `memgrad.analyze`'s memory model predicts the same."""
    weights, loss, relus = _relu_chain()
    x = tf.random.stateless_normal([16, 32], [3, 99])

    @tf.function
    def step(x):
        return memgrad.gradients(loss(x), weights, checkpoints=[relus[3], relus[7]])

    with memgrad.record_rewrites() as log:
        concrete = step.get_concrete_function(x)
    product, relu = 2 * 16 * 32 * 32, 16 * 32
    assert log[-1].recomputed_flops == 6 * (product + relu), log[-1]
    copies = [op for op in _copies_that_run(concrete) if op.type in ("MatMul", "Relu")]
    assert log[-1].recomputed_ops == len(copies) == 12, [op.name for op in copies]
    analyses = []

    @tf.function
    def analyzed(x):
        y = loss(x)
        analyses.append(memgrad.analyze(ys=y, xs=weights, checkpoints=[relus[3], relus[7]],
                                        budget_points=0))
        return y

    analyzed.get_concrete_function(x)
    assert analyses[0].recomputed_flops == 6 * (product + relu), analyses[0].recomputed_flops


# scratch=False: Eigen's convolution scratch (oneDNN off) would outweigh every plan here.
@pytest.mark.parametrize("checkpoints", ["memory", memgrad.strategies.Budget(0.9, hold_gradients=False, scratch=False)],
                         ids=["memory", "budget"])
def test_the_model_predicts_the_flops_the_copies_that_run_compute(checkpoints):
    """On keras.applications' MobileNetV3Small (convolutions, batch normalisation, hard
    swishes, squeeze-and-excitation), the memory model's recomputed FLOPs, which a Budget
    minimises, are what the rewrite's running copies compute (before the model left out
    the copies that never run: 69.8 against 65.5 MFLOP under 'memory' at 64x64)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=10)
    x = tf.random.stateless_normal([2, 32, 32, 3], [6, 1])

    def loss(x):
        return tf.reduce_mean(tf.square(model(x, training=True)))

    @tf.function
    def step(x):
        return memgrad.gradients(loss(x), model.trainable_variables, checkpoints=checkpoints)

    with memgrad.record_rewrites() as log:
        step.get_concrete_function(x)
    record = log[-1]
    assert not record.fallback and record.recomputed_flops > 0, record
    if checkpoints == "memory":
        predicted = memgrad.analyze(loss, args=(x,), budget_points=0).recomputed_flops
    else:
        predicted = record.plan.details["recomputed_flops"]
    assert abs(predicted - record.recomputed_flops) <= 0.01 * record.recomputed_flops, (
        predicted, record.recomputed_flops)


def test_speed_does_not_run_an_attention_product_again():
    """Causal scaled dot-product attention as keras-hub's GPT-2 writes it (the scores scaled
    after the query-key product, masked with `tf.where`), then a GELU MLP: 'speed' keeps the softmax, the second product's input, whose
    gradient reads it, and recomputes only cheap ops; the query-key product runs once."""
    d = 16
    weights = [tf.Variable(tf.random.stateless_normal(shape, [5, i]) * 0.2)
               for i, shape in enumerate([[d, d]] * 3 + [[d, 4 * d], [4 * d, d]])]

    def loss(x):
        q, k, v = (x @ w for w in weights[:3])
        scores = tf.einsum("btd,bsd->bts", q, k) * tf.cast(1.0 / d ** 0.5, x.dtype)
        causal = tf.cast(tf.linalg.band_part(tf.ones_like(scores), -1, 0), tf.bool)
        probs = tf.nn.softmax(tf.where(causal, scores, tf.fill(tf.shape(scores), -1e9)))
        h = x + tf.einsum("bts,bsd->btd", probs, v)
        return tf.reduce_sum(tf.square(h + tf.nn.gelu(h @ weights[3]) @ weights[4]))

    x = tf.random.stateless_normal([4, 12, d], [5, 9])

    @tf.function
    def step(x):
        return memgrad.gradients(loss(x), weights, checkpoints="speed")

    @tf.function
    def plain(x):
        return tf.gradients(loss(x), weights)

    with memgrad.record_rewrites() as log:
        concrete = step.get_concrete_function(x)
    assert log[-1].segments > 0 and not log[-1].fallback, log[-1]
    running = [op for op in _copies_that_run(concrete)  # not the ports and gates around the copies
               if op.type != "NoOp" and not op.name.split("/")[-1].startswith("port")]
    products = [op.name for op in running if op.type in ("MatMul", "BatchMatMulV2", "Einsum")]
    assert not products
    assert log[-1].recomputed_ops == len(running), [op.name for op in running]
    for got, want in zip(step(x), plain(x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("checkpoints", ["memory", "speed"])
def test_second_derivatives_through_peeled_relus_match_plain(checkpoints):
    """The peeled ReLU's gradient reads the kept output on the original op, as plain
    backprop's does: a gradient of the gradient is the same."""
    weights, loss, _ = _relu_chain(depth=8, width=16)
    x = tf.random.stateless_normal([8, 16], [4, 4])

    def hessian_vector(gradients):
        @tf.function
        def step(x):
            grads = gradients(loss(x), weights)
            inner = tf.add_n([tf.reduce_sum(g * g) for g in grads])
            return tf.gradients(inner, weights)
        return step(x)

    got = hessian_vector(lambda y, w: memgrad.gradients(y, w, checkpoints=checkpoints))
    want = hessian_vector(tf.gradients)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
