"""memgrad.gradients and memgrad.GradientTape answer exactly what tf.gradients / tf.GradientTape do.

Each test here failed on an earlier memgrad: intermediate tensors among xs, function-call ops
(Keras's grouped Conv2D), repeated xs, unconnected or empty xs, malformed grad_ys, every
public alias of tf.gradients, and the tape's watching rules.
"""

import warnings

import keras
import pytest
import tensorflow as tf

import memgrad
from tests.checkpointing.models import max_relative_error, rewritten

STRATEGIES = ["memory", "speed", memgrad.strategies.Budget(0.85)]  # feasible on every graph here (the cond graph: >= 0.777)


def _residual_weights(depth=12, width=16, seed=0):
    return [tf.Variable(tf.random.stateless_normal([width, width], [seed, i]) * 0.3)
            for i in range(depth)]


def _residual_forward(x, weights, shared=None):
    """h = h + tanh(h @ W) per layer; `shared` (if given) is used in every layer too."""
    h, hs = x, []
    for w in weights:
        pre = h @ w if shared is None else h @ w + h @ shared
        h = h + tf.tanh(pre)
        hs.append(h)
    return tf.reduce_sum(h * h), hs


@pytest.mark.slow
@pytest.mark.parametrize("checkpoints", STRATEGIES, ids=["memory", "speed", "budget"])
def test_intermediate_x_passes_its_gradient_upstream(checkpoints):
    weights = _residual_weights()
    shared = tf.Variable(tf.random.stateless_normal([16, 16], [9, 9]) * 0.1)
    x = tf.random.stateless_normal([64, 16], [1, 2])

    @tf.function
    def step(x):
        loss, hs = _residual_forward(x, weights, shared)
        # An intermediate tensor among xs, with variables on both sides of it, and a
        # variable (`shared`) used on both sides.
        xs = weights + [hs[3], shared, hs[8]]
        return tf.gradients(loss, xs), memgrad.gradients(loss, xs, checkpoints=checkpoints)

    with rewritten(allow_plain_speed=True):
        reference, checkpointed = step(x)
    assert all(g is not None for g in checkpointed)
    assert max_relative_error(reference, checkpointed) <= 1e-5


@pytest.mark.slow
def test_intermediate_x_through_gradient_tape():
    weights = _residual_weights()
    x = tf.random.stateless_normal([4, 16], [3, 4])

    @tf.function
    def step(x):
        with tf.GradientTape() as plain:
            loss, hs = _residual_forward(x, weights)
        reference = plain.gradient(loss, [hs[5]] + weights)
        with memgrad.GradientTape() as tape:
            loss, hs = _residual_forward(x, weights)
        return reference, tape.gradient(loss, [hs[5]] + weights)

    with rewritten():
        reference, checkpointed = step(x)
    assert max_relative_error(reference, checkpointed) <= 1e-5


def test_repeated_x_gets_its_gradient_at_every_position():
    weights = _residual_weights(depth=8)

    @tf.function
    def step(x):
        loss, _ = _residual_forward(x, weights)
        xs = [weights[2], weights[0], weights[2], *weights[3:]]  # the later layers' give 'speed' a plan
        return tf.gradients(loss, xs), memgrad.gradients(loss, xs, checkpoints="speed")

    with rewritten():
        reference, checkpointed = step(tf.random.stateless_normal([4, 16], [5, 6]))
    assert max_relative_error(reference, checkpointed) <= 1e-5


def _grouped_conv_model():
    """Residual blocks around a grouped Conv2D, which Keras runs as a nested XLA function."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 8))
    h = inputs
    for _ in range(3):
        r = keras.layers.Conv2D(8, 3, groups=4, padding="same")(h)
        r = keras.layers.LayerNormalization()(r)
        r = keras.layers.Dense(16, activation="gelu")(r)
        h = keras.layers.Add(name=None)([h, keras.layers.Dense(8)(r)])
    outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h))
    return keras.Model(inputs, outputs)


@pytest.mark.slow
def test_function_call_op_in_the_last_segment():
    model = _grouped_conv_model()
    variables = model.trainable_variables

    @tf.function
    def step(x):
        loss = tf.reduce_sum(model(x) ** 2)
        graph = loss.graph
        adds = [op.outputs[0] for op in graph.get_operations() if op.type == "AddV2"
                and "/add" in op.name]
        # Keep only the first block's output: the later grouped convolutions (function
        # calls) then fall in the last segment, which tf.gradients once differentiated
        # with a SymbolicGradient node that cannot run.
        return (tf.gradients(loss, variables),
                memgrad.gradients(loss, variables, checkpoints=adds[:1]),
                memgrad.gradients(loss, variables, checkpoints="memory"))

    with rewritten(calls=2):
        reference, listed, automatic = step(tf.random.stateless_normal([2, 8, 8, 8], [7, 8]))
    assert max_relative_error(reference, listed) <= 1e-5
    assert max_relative_error(reference, automatic) <= 1e-5


# ---------------------------------------------------------------------- drop-in contract
def test_empty_xs_and_ys_like_tf_gradients():
    v = tf.Variable(tf.ones([2, 2]))

    @tf.function
    def step(x):
        loss = tf.reduce_sum(x @ v)
        return memgrad.gradients(loss, []), memgrad.gradients([], [v])

    no_xs, no_ys = step(tf.ones([2, 2]))
    assert no_xs == [] and no_ys == [None]


def test_grad_ys_of_the_wrong_shape_or_dtype_is_a_clear_error():
    v = tf.Variable(tf.ones([3, 3]))

    def step(dy):
        return tf.function(lambda x: memgrad.gradients(x @ v, [v], grad_ys=[dy]))(
            tf.ones([4, 3]))

    with pytest.raises(ValueError, match=r"grad_ys\[0\] must have the shape .*Received: shape"):
        step(tf.ones([5]))
    with pytest.raises(ValueError, match=r"grad_ys\[0\] must have the dtype .*Received: dtype"):
        step(tf.ones([4, 3], tf.float64))


ALIASES = [
    "tf.gradients",
    "tf.compat.v1.gradients",
    "tf.compat.v2.gradients",
    "tf.compat.v1.compat.v1.gradients",
    "tf.compat.v1.compat.v2.gradients",
    "tf.compat.v2.compat.v1.gradients",
    "tf.compat.v2.compat.v2.gradients",
]


def _resolve(path):
    value = tf
    for part in path.split(".")[1:]:
        value = getattr(value, part)
    return value


@pytest.mark.slow
def test_monkey_patch_reaches_every_public_alias_and_unpatch_restores_them():
    originals = {path: _resolve(path) for path in ALIASES}
    weights = _residual_weights(depth=8)
    x = tf.random.stateless_normal([4, 16], [1, 1])
    reference = tf.function(lambda x: tf.gradients(_residual_forward(x, weights)[0], weights))(x)
    memgrad.monkey_patch(checkpoints="memory")
    try:
        for path in ALIASES:
            patched = _resolve(path)
            assert patched is not originals[path], path

            @tf.function
            def step(x, patched=patched):
                # The v1 functions take colocate_gradients_with_ops as the fifth positional
                # argument, the v2 ones gate_gradients: both must keep their meaning.
                return patched(_residual_forward(x, weights)[0], weights, None, "g")

            with rewritten():
                result = step(x)
            assert max_relative_error(reference, result) <= 1e-5, path
    finally:
        memgrad.unpatch()
    for path in ALIASES:
        assert _resolve(path) is originals[path], path


def test_monkey_patched_unconnected_x_returns_none():
    v, unused = tf.Variable(tf.ones([4, 4])), tf.Variable(1.0)
    memgrad.monkey_patch()
    try:
        grads = tf.function(lambda x: tf.gradients(tf.reduce_sum(tf.tanh(x @ v)), [unused]))(
            tf.ones([2, 4]))
    finally:
        memgrad.unpatch()
    assert grads == [None]


def test_tape_without_watching_accessed_variables_differentiates_only_watched_ones():
    w, u = tf.Variable(tf.ones([3, 3]) * 0.5), tf.Variable(2.0)

    @tf.function
    def step(x):
        results = []
        for tape_class in (tf.GradientTape, memgrad.GradientTape):
            with tape_class(watch_accessed_variables=False) as tape:
                tape.watch(u)
                h = x
                for _ in range(4):
                    h = tf.tanh(h @ w)
                loss = tf.reduce_sum(h) * u
            results.append(tape.gradient(loss, [w, u]))
        return results

    (plain_w, plain_u), (ours_w, ours_u) = step(tf.ones([2, 3]))
    assert plain_w is None and ours_w is None
    assert abs(float(plain_u) - float(ours_u)) <= 1e-6 * abs(float(plain_u))


def test_non_persistent_tape_computes_one_set_of_gradients():
    w = tf.Variable(tf.ones([3, 3]) * 0.5)

    @tf.function
    def step(x, persistent):
        with memgrad.GradientTape(persistent=persistent) as tape:
            loss = tf.reduce_sum(tf.tanh(x @ w))
        first = tape.gradient(loss, [w])
        return first, tape.gradient(loss, [w])

    first, second = step(tf.ones([2, 3]), True)
    assert float(tf.reduce_max(tf.abs(first[0] - second[0]))) == 0.0
    with pytest.raises(RuntimeError, match="non-persistent GradientTape can only be used"):
        step(tf.ones([2, 3]), False)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["variable", "constant"])
def test_input_held_in_a_variable_or_constant_is_still_an_activation_stream(source):
    weights = _residual_weights(depth=16, width=32)
    values = tf.random.stateless_normal([256, 32], [2, 2])
    held = tf.Variable(values)

    @tf.function
    def step():
        x = held if source == "variable" else tf.constant(values.numpy())
        loss, _ = _residual_forward(x, weights)
        xs = weights + ([held] if source == "variable" else [])
        return tf.gradients(loss, xs), memgrad.gradients(loss, xs, checkpoints="memory")

    with rewritten():  # once "found nothing worth keeping" and fell back
        reference, checkpointed = step()
    assert max_relative_error(reference, checkpointed) <= 1e-5


@pytest.mark.slow
def test_stop_gradients_give_partial_derivatives():
    weights = _residual_weights(depth=10)

    @tf.function
    def step(inputs):
        x = inputs @ weights[0]
        loss, hs = _residual_forward(x, weights[1:])
        y = hs[2]
        loss = loss + tf.reduce_sum(3.0 * x)
        results = []
        for xs, stops in (([x], [x, y]), ([inputs, weights[4]], [inputs, y]),
                          (weights, [y]), ([x, y], [y])):
            results.append((tf.gradients(loss, xs, stop_gradients=stops),
                            memgrad.gradients(loss, xs, stop_gradients=stops,
                                              checkpoints="speed")))
        return results

    for reference, checkpointed in step(tf.random.stateless_normal([4, 16], [4, 4])):
        for a, b in zip(reference, checkpointed):
            assert (a is None) == (b is None)
        present = [(a, b) for a, b in zip(reference, checkpointed) if a is not None]
        assert max_relative_error(*zip(*present)) <= 1e-5


def test_x_that_is_a_y_gets_its_incoming_gradient():
    weights = _residual_weights(depth=8)

    @tf.function
    def step(x):
        loss, _ = _residual_forward(x, weights)
        return (tf.gradients(loss, [loss]), memgrad.gradients(loss, [loss]),
                tf.gradients(loss, [loss] + weights), memgrad.gradients(loss, [loss] + weights))

    alone_ref, alone, mixed_ref, mixed = step(tf.random.stateless_normal([4, 16], [6, 6]))
    assert float(alone[0]) == float(alone_ref[0]) == 1.0
    assert max_relative_error(mixed_ref, mixed) <= 1e-5


# ---------------------------------------------------------------------- found by the property suite
def _cond_forward(x, weights):
    """A chain with a data-dependent tf.cond (a StatelessIf op) in the middle."""
    h = x
    for i, w in enumerate(weights):
        h = tf.tanh(h @ w)
        if i == 2:
            h = tf.cond(tf.reduce_mean(h) > 0.0, lambda: tf.tanh(h @ weights[0]),
                        lambda: tf.nn.relu(h) * 0.5)
    return tf.reduce_sum(h * h)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoints", STRATEGIES, ids=["memory", "speed", "budget"])
def test_cond_already_differentiated_by_tf_gradients(checkpoints):
    # tf.gradients rewrites an If op to output its intermediates (variants); memgrad then
    # differentiated the op in place with None for those outputs, and cond's gradient
    # failed ("dtype variant is not compatible with 1 of dtype int64").
    weights = _residual_weights(depth=12, width=16)

    @tf.function(autograph=False)
    def step(x):
        loss = _cond_forward(x, weights)
        reference = tf.gradients(loss, weights)
        return reference, memgrad.gradients(loss, weights, checkpoints=checkpoints)

    with rewritten():
        reference, checkpointed = step(tf.random.stateless_normal([64, 16], [1, 2]))
    assert max_relative_error(reference, checkpointed) <= 1e-5


def test_memory_model_probe_of_a_wrapped_cond_assumes_every_tensor_read():
    # The memory model probes each op's gradient in a scratch graph. For the function call
    # wrapping a cond, the ops that gradient makes refer to functions the scratch graph
    # lacks, and reading their inputs raised KeyError('') out of the Budget planner.
    from memgrad._src.graph.memory_model import gradient_reads

    weights = _residual_weights(depth=6, width=8)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape(), tf.GradientTape():
            loss = _cond_forward(x, weights)
        calls = [op for op in loss.graph.get_operations() if op.type in (
            "PartitionedCall", "StatefulPartitionedCall")]
        assert calls, "expected the cond wrapped in a function call"
        inputs, outputs = gradient_reads(calls[0])
        floating = [i for i, t in enumerate(calls[0].outputs) if t.dtype.is_floating]
        assert outputs == frozenset(floating)
        return loss

    step(tf.random.stateless_normal([4, 8], [3, 4]))


def test_cond_under_two_tapes():
    # Under two tapes the cond is wrapped in a function call; its gradient, taken in place
    # with None for the call's variant outputs, captured a tensor of the wrapper's graph
    # (InaccessibleTensorError). Zeros for them, as tf.gradients gives, fixed it too.
    weights = _residual_weights(depth=6, width=8)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape(), tf.GradientTape():
            loss = _cond_forward(x, weights)
        return tf.gradients(loss, weights), memgrad.gradients(loss, weights, checkpoints="speed")

    with rewritten():
        reference, checkpointed = step(tf.random.stateless_normal([4, 8], [3, 4]))
    assert max_relative_error(reference, checkpointed) <= 1e-5


def _tape_paths(tape_class, x, weights, extra, checkpoints):
    """Gradients a tape gives for parts of a step computed outside its recording: after the
    `with` block, inside `stop_recording()`, and before `reset()`."""
    kwargs = {} if tape_class is tf.GradientTape else {"checkpoints": checkpoints}
    with tape_class(persistent=True, **kwargs) as tape:
        inside, hs = _residual_forward(x, weights)
    after = tf.reduce_sum(tf.tanh(hs[-1] @ extra))  # not recorded: a constant to the tape
    with tape:
        with tape.stop_recording():
            paused = tf.reduce_sum(tf.sin(hs[5] @ extra))  # not recorded either
        total = inside + after + paused
    results = [tape.gradient(after, weights + [extra]), tape.gradient(total, weights + [extra])]
    with tape_class(persistent=True, **kwargs) as tape:
        forgotten, _ = _residual_forward(x, weights)
        tape.reset()  # what was recorded so far is forgotten
        kept = forgotten * tf.reduce_sum(extra)
    results.append(tape.gradient(kept, weights + [extra]))
    return results


@pytest.mark.parametrize("checkpoints", ["memory", "speed", memgrad.strategies.Budget("1MiB")], ids=str)
def test_tape_differentiates_only_what_it_recorded(checkpoints):
    """tf.GradientTape gives no gradient through ops run after its `with` block, inside
    `stop_recording()` or before `reset()`; memgrad.GradientTape differentiates the graph, and
    gave them one (12 where tf.GradientTape gives None, on a target computed after the block)."""
    weights = _residual_weights(depth=16, width=16)
    extra = tf.Variable(tf.random.stateless_normal([16, 16], [5, 5]))

    @tf.function
    def step(x):
        return (_tape_paths(tf.GradientTape, x, weights, extra, checkpoints),
                _tape_paths(memgrad.GradientTape, x, weights, extra, checkpoints))

    with memgrad.record_rewrites() as log:
        reference, ours = step(tf.random.stateless_normal([64, 16], [1, 2]))
    if checkpoints == "memory":  # the whole step's gradient is rewritten, around the stops
        assert any(entry.segments > 1 and not entry.fallback for entry in log), log
    for expected, got in zip(reference, ours):
        assert [g is None for g in expected] == [g is None for g in got]
        pairs = [(e, g) for e, g in zip(expected, got) if e is not None]
        if pairs:
            assert max_relative_error([e for e, _ in pairs], [g for _, g in pairs]) <= 1e-5
    assert all(g is None for g in reference[0])  # after the block: nothing recorded
    assert all(g is not None for g in reference[1][:-1])  # the recorded part of the total
    assert reference[1][-1] is None  # `extra` enters it only through ops not recorded
    assert reference[2][0] is None and reference[2][-1] is not None  # forgotten; recorded after


@pytest.mark.parametrize("pfor", [True, False], ids=["pfor", "while_loop"])
def test_tape_jacobians_match_tf_gradient_tape(pfor):
    """`jacobian` and `batch_jacobian` add ops after the `with` block and record them again
    themselves (through the tape's push/pop): they are recorded for memgrad too (a version
    that noted only `with` blocks gave None for both). Without pfor they take one gradient
    per row inside a while loop, of what the tape recorded outside it: memgrad leaves those
    to tf.GradientTape, with a warning (plain tf.gradients there gave the variable None)."""
    w = tf.Variable(tf.random.stateless_normal([8, 8], [3, 4]) * 0.5)

    @tf.function
    def step(x):
        results = []
        for tape_class in (tf.GradientTape, memgrad.GradientTape):
            with tape_class(persistent=True) as tape:
                tape.watch(x)
                y = tf.tanh(tf.tanh(x @ w) @ w)
            results.append([tape.jacobian(y, w, experimental_use_pfor=pfor),
                            tape.jacobian(y, x, experimental_use_pfor=pfor),
                            tape.batch_jacobian(y, x, experimental_use_pfor=pfor)])
        return results

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference, ours = step(tf.random.stateless_normal([4, 8], [1, 1]))
    assert all(g is not None for g in ours)
    assert max_relative_error(reference, ours) <= 1e-5
    left = [w for w in caught if "Using tf.GradientTape's gradient" in str(w.message)]
    assert len(left) == (0 if pfor else 3), [str(w.message) for w in caught]
