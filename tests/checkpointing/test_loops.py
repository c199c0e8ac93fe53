"""Loops through the rewrite: exact gradients, one unit never cut, segments of steps.

Every form of loop TensorFlow and Keras build (tf.scan, tf.foldl, tf.map_fn, tf.while_loop
writing a TensorArray, nested loops, a loop inside tf.cond, a loop whose trip count depends
on the data, Keras's recurrent layers) is differentiated in one tf.function by tf.gradients
(the reference) and by memgrad's entry points, on the same forward pass where the entry
point allows it. Gradients must match to 1e-5 (relative to the largest entry), none may be
None where the reference is not, and no call may fall back to plain tf.gradients.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src.checkpointing import api, loops
from tests.checkpointing.loop_memory_probe import ENV

TOLERANCE = 1e-5
STEPS, BATCH, WIDTH = 12, 3, 5


def _relative_errors(reference, got):
    errors = []
    for r, g in zip(reference, got):
        if r is None:
            assert g is None, "memgrad gave a gradient where tf.gradients gives None"
            continue
        assert g is not None, "memgrad gave None where tf.gradients gives a gradient"
        r, g = tf.convert_to_tensor(r).numpy(), tf.convert_to_tensor(g).numpy()
        errors.append(float(np.abs(r - g).max() / max(np.abs(r).max(), 1e-30)))
    return errors


@pytest.fixture(autouse=True)
def _no_fallback():
    """Every memgrad call of a test is logged; none may fail to rewrite (plain tf.gradients
    because nothing was worth keeping, as 'speed' finds on a lone loop, is not a failure)."""
    with warnings.catch_warnings(record=True) as caught, memgrad.record_rewrites() as log:
        warnings.simplefilter("always")
        yield log
    for entry in log:
        assert not entry.fallback_reason, f"fell back to plain tf.gradients: {entry}"
    failures = [str(w.message) for w in caught if "cannot rewrite" in str(w.message)]
    assert not failures, failures


# ---------------------------------------------------------------------- loop forms
def _weights(seed=0):
    return [tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], [seed, i]) * 0.4)
            for i in range(2)]


def _scan(x, w, u):
    h = tf.scan(lambda c, x_t: tf.tanh(c @ w + x_t @ u), x, initializer=tf.zeros([BATCH, WIDTH]))
    return tf.reduce_sum(tf.tanh(h) ** 2)


def _foldl(x, w, u):
    c = tf.foldl(lambda c, x_t: tf.tanh(c @ w + x_t @ u), x, initializer=tf.zeros([BATCH, WIDTH]))
    return tf.reduce_sum(tf.sin(c))


def _map_fn(x, w, u):
    h = tf.map_fn(lambda x_t: tf.tanh(x_t @ w) @ u, x)
    return tf.reduce_sum(h ** 2)


def _while_tensor_array(x, w, u, dynamic_size=False):
    written = tf.TensorArray(tf.float32, size=0 if dynamic_size else STEPS,
                             dynamic_size=dynamic_size)

    def body(i, c, written):
        c = tf.tanh(c @ w + x[i] @ u)
        return i + 1, c, written.write(i, c)

    _, c, written = tf.while_loop(lambda i, c, _: i < STEPS, body,
                                  (0, tf.zeros([BATCH, WIDTH]), written))
    return tf.reduce_sum(tf.tanh(written.stack()) ** 2) + tf.reduce_sum(c)


def _nested(x, w, u):
    def outer(c, x_t):
        inner = tf.scan(lambda d, k: tf.tanh(d @ w + k * x_t @ u), tf.range(1.0, 4.0),
                        initializer=c)
        return inner[-1]

    return tf.reduce_sum(tf.scan(outer, x, initializer=tf.zeros([BATCH, WIDTH])) ** 2)


def _in_cond(x, w, u):
    def looped():
        return tf.scan(lambda c, x_t: tf.tanh(c @ w + x_t @ u), x,
                       initializer=tf.zeros([BATCH, WIDTH]))[-1]

    c = tf.cond(tf.reduce_sum(x) > -1e9, looped, lambda: tf.zeros([BATCH, WIDTH]))
    return tf.reduce_sum(tf.tanh(c @ w) ** 2)


def _data_dependent_steps(x, w, u):
    # Runs while the state's norm stays under a threshold: the trip count depends on data.
    def body(i, c):
        return i + 1, tf.tanh(c @ w + x[tf.minimum(i, STEPS - 1)] @ u) * 1.5

    _, c = tf.while_loop(lambda i, c: tf.logical_and(i < 100, tf.norm(c) < 3.0), body,
                         (0, tf.zeros([BATCH, WIDTH]) + 0.1))
    return tf.reduce_sum(c ** 2)


FORMS = {
    "scan": (_scan, "segments"),
    "foldl": (_foldl, "segments"),
    "map_fn": (_map_fn, "segments"),
    "while_tensor_array": (_while_tensor_array, "segments"),
    "dynamic_size_tensor_array": (lambda *a: _while_tensor_array(*a, dynamic_size=True), "replay"),
    "nested": (_nested, "segments"),
    "in_cond": (_in_cond, None),  # the loop is inside the If's branch: TensorFlow's gradient
    "data_dependent_steps": (_data_dependent_steps, "segments"),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_loop_forms_match_tf_gradients_through_every_entry_point(form, _no_fallback):
    forward, expected_mode = FORMS[form]
    w, u = _weights()
    x = tf.random.stateless_normal([STEPS, BATCH, WIDTH], [1, 2])

    @tf.function
    def step(x):
        loss = forward(x, w, u)
        sources = [x, w, u]
        reference = tf.gradients(loss, sources)
        memory = memgrad.gradients(loss, sources, checkpoints="memory")
        speed = memgrad.gradients(loss, sources, checkpoints="speed")
        with memgrad.GradientTape(checkpoints="memory") as tape:
            tape.watch(x)
            taped_loss = forward(x, w, u)
        taped = tape.gradient(taped_loss, sources)
        return reference, memory, speed, taped

    reference, *results = step(x)
    for got in results:
        assert max(_relative_errors(reference, got)) <= TOLERANCE
    modes = {record.mode for entry in _no_fallback for record in entry.loops}
    if expected_mode is not None:
        assert expected_mode in modes, [entry.loops for entry in _no_fallback]
    speed_entries = [entry for entry in _no_fallback if entry.mode == "speed"]
    assert all(r.mode == "kept" for entry in speed_entries for r in entry.loops)


def test_monkey_patched_tf_gradients_through_a_scan():
    w, u = _weights(3)
    x = tf.random.stateless_normal([STEPS, BATCH, WIDTH], [3, 4])

    @tf.function
    def step(x):
        loss = _scan(x, w, u)
        reference = api.TF_GRADIENTS_V1(loss, [x, w, u])
        return reference, tf.gradients(loss, [x, w, u])

    memgrad.monkey_patch()
    try:
        with memgrad.record_rewrites() as log:
            reference, got = step(x)
    finally:
        memgrad.unpatch()
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    assert [r.mode for r in log[0].loops] == ["segments"]


def test_segments_keep_every_kth_state_and_say_so():
    w, u = _weights(5)
    x = tf.random.stateless_normal([100, BATCH, WIDTH], [5, 6])

    @tf.function
    def step(x):
        loss = _scan(x, w, u)
        return tf.gradients(loss, [w]), memgrad.gradients(loss, [w])

    with memgrad.record_rewrites() as log:
        reference, got = step(x)
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    (record,) = log[0].loops
    # The scan's state (one [BATCH, WIDTH] carry) is small beside a step's intermediates:
    # the shortest segments allowed, half of sqrt(100) steps.
    assert record == memgrad.LoopRecord("scan/while", "segments", 5, "")


def test_segments_carry_only_the_gradients_asked_for():
    """The backward loop over segments sums each invariant's gradient (a variable, the
    sequence a scan reads) segment by segment; one no x flows into is left out, as
    tf.gradients prunes it: the sequence's gradient, one more product per step, cost a
    4,096-step scan a third more time than replaying it whole."""
    w, u = _weights(8)
    x = tf.random.stateless_normal([40, BATCH, WIDTH], [8, 9])

    def segment_loop_inputs(graph):
        (loop,) = [op for op in graph.get_operations() if op.name.endswith("memgrad_segments")]
        return [t.dtype for t in loop.inputs]

    carried = {}
    for name, wrt in (("w", lambda x: [w]), ("all", lambda x: [w, u, x])):
        @tf.function
        def step(x, wrt=wrt):
            loss = _scan(x, w, u)
            return tf.gradients(loss, wrt(x)), memgrad.gradients(loss, wrt(x))

        reference, got = step(x)
        assert max(_relative_errors(reference, got)) <= TOLERANCE
        carried[name] = segment_loop_inputs(step.get_concrete_function(x).graph)
    # u's gradient and the sequence's (a TensorList) are carried only when asked for.
    assert len(carried["all"]) == len(carried["w"]) + 2, carried
    assert carried["all"].count(tf.variant) == carried["w"].count(tf.variant) + 1, carried


def test_few_steps_are_replayed_whole():
    w, u = _weights(6)
    x = tf.random.stateless_normal([4, BATCH, WIDTH], [6, 7])

    @tf.function
    def step(x):
        loss = _scan(x, w, u)
        return tf.gradients(loss, [w, u]), memgrad.gradients(loss, [w, u])

    with memgrad.record_rewrites() as log:
        reference, got = step(x)
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    (record,) = log[0].loops
    assert (record.mode, record.reason) == ("replay", "it runs at most 4 steps")


def test_a_stateful_body_is_kept_with_a_warning_naming_the_op():
    w, u = _weights(7)
    x = tf.random.stateless_normal([STEPS, BATCH, WIDTH], [7, 8])

    @tf.function
    def step(x):
        # An unseeded random op inside the body: a replay would draw other numbers.
        h = tf.scan(lambda c, x_t: tf.tanh(c @ w + x_t @ u) * tf.random.uniform([]), x,
                    initializer=tf.zeros([BATCH, WIDTH]))
        loss = tf.reduce_sum(h ** 2)
        return tf.gradients(loss, [w, u]), memgrad.gradients(loss, [w, u])

    with pytest.warns(UserWarning, match=r"loop 'scan/while' is not recomputed: its body runs "
                                         r"the stateful op RandomUniform"):
        with memgrad.record_rewrites() as log:
            reference, got = step(x)
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    (record,) = log[0].loops
    assert record.mode == "kept" and "RandomUniform" in record.reason


# ---------------------------------------------------------------------- Keras layers
RNN_LAYERS = {
    "LSTM": lambda: [keras.layers.LSTM(6, return_sequences=True), keras.layers.LSTM(4)],
    "GRU": lambda: [keras.layers.GRU(6, return_sequences=True, reset_after=False),
                    keras.layers.GRU(4, go_backwards=True)],
    "SimpleRNN": lambda: [keras.layers.SimpleRNN(6, return_sequences=True)],
    "Bidirectional": lambda: [keras.layers.Bidirectional(keras.layers.LSTM(5, return_sequences=True))],
    "LSTM_dropout_masking": lambda: [keras.layers.Masking(0.0),
                                     keras.layers.LSTM(5, dropout=0.2, recurrent_dropout=0.2)],
}


@pytest.mark.parametrize("name", sorted(RNN_LAYERS))
def test_keras_recurrent_layers_match_tf_gradient_tape(name):
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((STEPS, WIDTH)), keras.layers.Dense(WIDTH)]
                             + RNN_LAYERS[name]() + [keras.layers.Dense(2)])
    x = tf.random.stateless_normal([BATCH, STEPS, WIDTH], [11, 12])

    @tf.function
    def step(x):
        # One forward pass (so dropout masks agree): both gradients of the same loss.
        loss = tf.reduce_sum(model(x, training=True) ** 2)
        sources = [x] + model.trainable_variables
        return tf.gradients(loss, sources), memgrad.gradients(loss, sources)

    with memgrad.record_rewrites() as log:
        reference, got = step(x)
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    assert log[0].loops and all(r.mode == "segments" for r in log[0].loops), log[0].loops


@pytest.mark.slow
def test_keras_lstm_under_mirrored_strategy_matches_tf_gradients(mirrored_strategy):
    """Each replica differentiates its own LSTM (its copies of the mirrored weights) with
    respect to the weights alone: the segments carry the weights' gradients, read through the
    replica's variable handles, and leave out the input sequence's."""
    strategy = mirrored_strategy
    keras.utils.set_random_seed(14)
    with strategy.scope():
        model = keras.Sequential([keras.Input((STEPS * 2, WIDTH)),
                                  keras.layers.LSTM(6, return_sequences=True),
                                  keras.layers.LSTM(4), keras.layers.Dense(2)])
    x = tf.random.stateless_normal([2 * BATCH, STEPS * 2, WIDTH], [14, 15])

    @tf.function
    def step(x):
        def replica_step(x):
            loss = tf.reduce_sum(model(x, training=True) ** 2)
            return (tf.gradients(loss, model.trainable_variables),
                    memgrad.gradients(loss, model.trainable_variables))

        halves = strategy.experimental_distribute_values_from_function(
            lambda ctx: x[ctx.replica_id_in_sync_group * BATCH:][:BATCH])
        return strategy.run(replica_step, args=(halves,))

    with memgrad.record_rewrites() as log:
        reference, got = step(x)
    assert len(log) == 2 and all(r.mode == "segments" for entry in log for r in entry.loops), log
    for replica in range(2):
        pick = [strategy.experimental_local_results(g)[replica] for g in reference + got]
        half = len(pick) // 2
        assert min(float(tf.reduce_max(tf.abs(g))) for g in pick[:half]) > 0
        assert max(_relative_errors(pick[:half], pick[half:])) <= TOLERANCE


@pytest.mark.slow
def test_conv_lstm_2d_matches_tf_gradients():
    keras.utils.set_random_seed(12)
    model = keras.Sequential([keras.Input((5, 6, 6, 2)),
                              keras.layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True),
                              keras.layers.ConvLSTM2D(2, 3)])
    x = tf.random.stateless_normal([2, 5, 6, 6, 2], [12, 13])

    @tf.function
    def step(x):
        loss = tf.reduce_sum(model(x, training=True) ** 2)
        sources = [x] + model.trainable_variables
        return tf.gradients(loss, sources), memgrad.gradients(loss, sources)

    reference, got = step(x)
    assert max(_relative_errors(reference, got)) <= TOLERANCE


@pytest.mark.slow
def test_keras_hub_rwkv7_matches_tf_gradients():
    """keras-hub's RWKV-7 (random init): on TensorFlow its time mixing writes a TensorArray
    step by step (the TensorList handles chain the steps into one unit of the rewrite)."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(14)
    model = keras_hub.models.RWKV7Backbone(
        hidden_size=32, head_size=16, num_layers=2, vocabulary_size=50, intermediate_dim=64,
        gate_lora=8, mv_lora=8, aaa_lora=8, decay_lora=8)
    ids = tf.constant(np.random.default_rng(14).integers(1, 50, (2, 8)), tf.int32)
    inputs = {"token_ids": ids, "padding_mask": tf.ones_like(ids)}

    @tf.function
    def step(inputs):
        loss = tf.reduce_mean(tf.square(tf.cast(model(inputs, training=True), tf.float32)))
        return (tf.gradients(loss, model.trainable_variables),
                memgrad.gradients(loss, model.trainable_variables))

    with memgrad.record_rewrites() as log:
        reference, got = step(inputs)
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    assert log[0].segments >= 2


def _lstm_model():
    keras.utils.set_random_seed(21)
    return keras.Sequential([keras.Input((16, 4)), keras.layers.Dense(8),
                             keras.layers.LSTM(8, return_sequences=True), keras.layers.LSTM(6),
                             keras.layers.Dense(1)])


@pytest.mark.parametrize("jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["graph", "xla"])
def test_fit_with_checkpointing_trains_the_recurrent_layers_like_keras(jit_compile, _no_fallback):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 16, 4)).astype("float32")
    y = rng.standard_normal((16, 1)).astype("float32")
    trained = []
    for checkpointed in (False, True):
        model = _lstm_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile)
        if checkpointed:
            memgrad.enable_checkpointing(model, checkpoints="memory")
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
        trained.append(model.get_weights())
    initial = _lstm_model().get_weights()
    for before, plain, mine in zip(initial, *trained):
        assert not np.allclose(before, plain)  # every weight trained, the LSTMs' included
        np.testing.assert_allclose(mine, plain, rtol=1e-5, atol=1e-6)
    assert all(r.mode == "segments" for entry in _no_fallback for r in entry.loops)
    assert sum(len(entry.loops) for entry in _no_fallback) >= 2


@pytest.mark.slow
def test_xla_gradients_of_a_scan_run_in_segments():
    w, u = _weights(8)
    x = tf.random.stateless_normal([40, BATCH, WIDTH], [8, 9])

    @tf.function(jit_compile=True)
    def step(x):
        loss = _scan(x, w, u)
        return tf.gradients(loss, [x, w, u]), memgrad.gradients(loss, [x, w, u])

    with memgrad.record_rewrites() as log:
        reference, got = step(x)
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    # 40 steps, a small carry: the shortest divisor allowed (half of ceil(sqrt(40)) = 4).
    assert [(r.mode, r.steps_per_segment) for r in log[0].loops] == [("segments", 4)]


# ---------------------------------------------------------------------- never silent
def test_a_lost_gradient_falls_back_to_tf_gradients_with_a_warning(monkeypatch, _no_fallback):
    """The invariant check: a rewrite that loses an x's gradient is caught, not returned."""
    w, u = _weights(9)
    x = tf.random.stateless_normal([STEPS, BATCH, WIDTH], [9, 10])
    real = api.rewrite_gradients

    def losing(*args, **kwargs):
        grads, rewrite = real(*args, **kwargs)
        return [None] + list(grads[1:]), rewrite

    monkeypatch.setattr(api, "rewrite_gradients", losing)

    @tf.function
    def step(x):
        loss = _scan(x, w, u)
        return tf.gradients(loss, [x, w]), memgrad.gradients(loss, [x, w])

    with pytest.warns(UserWarning, match=r"the rewrite lost the gradient of xs\[0\]"):
        with memgrad.record_rewrites() as log:
            reference, got = step(x)
    assert max(_relative_errors(reference, got)) <= TOLERANCE
    assert log[0].fallback and "lost the gradient" in log[0].fallback_reason
    _no_fallback.clear()  # the one fallback this test expects


def test_the_segment_length_divides_the_steps_under_xla():
    assert loops.dividing_segment_length(512) == 16
    assert loops.dividing_segment_length(40) == 5
    assert loops.dividing_segment_length(97) is None  # a prime: no divisor near sqrt


def test_a_small_state_beside_large_steps_gets_shorter_segments():
    # An RNN keeps h and c (16 KiB) per kept state but ~560 KiB per replayed step: the
    # memory T/k*state + k*step is least near k = 4, held at sqrt(512)/2 = 12 for the
    # launches; a large state beside small steps gets longer segments than sqrt(T).
    assert loops.segment_length(512, 16388, 567296) == 12
    assert loops.segment_length(512, 1 << 20, 1 << 10) == 512
    assert loops.segment_length(400, 1000, 1000) == 20
    assert loops.dividing_segment_length(512, 16388, 567296) == 16
    assert loops.dividing_segment_length(512, 1000, 1000) == 16
    assert loops.segment_length(100) == 10 and loops.segment_length(101) == 11


def test_a_nested_loop_reading_a_variable_gets_its_gradient():
    """A loop's functions rebuilt for a replay lack the handle data of their resource
    inputs (TensorFlow does not copy it for loops): a nested loop then gave a variable it
    reads a zero gradient, which no None-check catches."""
    w, u = _weights(13)
    x = tf.random.stateless_normal([4, BATCH, WIDTH], [13, 14])

    @tf.function
    def step(x):
        loss = _nested(x, w, u)
        return tf.gradients(loss, [w, u]), memgrad.gradients(loss, [w, u])

    reference, got = step(x)
    assert min(float(tf.reduce_max(tf.abs(g))) for g in reference) > 1e-3
    assert max(_relative_errors(reference, got)) <= TOLERANCE


def test_stateful_op_in_finds_random_ops_and_allows_variable_reads():
    w, u = _weights(10)

    @tf.function
    def graph_of(x):
        tf.scan(lambda c, x_t: tf.tanh(c @ w), x, initializer=tf.zeros([BATCH, WIDTH]))
        tf.scan(lambda c, x_t: c + tf.random.normal([BATCH, WIDTH]), x,
                initializer=tf.zeros([BATCH, WIDTH]))
        return x

    graph = graph_of.get_concrete_function(tf.TensorSpec([STEPS, BATCH, WIDTH])).graph
    reads, draws = [op for op in graph.get_operations() if op.type in loops.LOOP_TYPES]
    assert loops.stateful_op_in(reads) is None
    assert loops.stateful_op_in(draws)[0] == "RandomStandardNormal"


# ---------------------------------------------------------------------- memory through time
# Measured in fresh processes with one inter-op thread (tests/checkpointing/
# loop_memory_probe.py says why): a fixed order of ops; the peaks still move from process
# to process by up to a fifth, and the bounds below are over the measured spread.
FRESH_PROCESSES = {
    name: dict(target=f"tests.checkpointing.loop_memory_probe:{name}", env=ENV, timeout=900,
               expected_s=60)  # wall time in CI's memory pass (the longest start first: conftest.py)
    for name in ("lstm_peaks", "gru_scan_peaks")
}


@pytest.mark.memory
@pytest.mark.kernel_neutral  # the spread below was measured with oneDNN's kernels and without
def test_a_two_layer_lstm_keeps_at_most_four_tenths_of_plain_backprops_peak(fresh_results):
    """2 Keras LSTM layers of 128 units over 512 steps, batch 16: every step's gates kept
    by plain backprop; memgrad keeps the state at every 12th step and replays segments.

    Measured with one inter-op thread, the peaks still move from process to process: in ten
    fresh processes on one machine (six with oneDNN, four without), plain 76.3-86.3 MiB
    (oneDNN; 85.8-86.2 without), memory 20.3-23.8 MiB, tape 20.8-23.6 MiB, memory/plain
    0.235-0.308; and once, in a loop of the memory tests, memory 27.6 MiB against plain
    78.6 (0.351x, a failure of the 0.35 bound this test had). The bound, 0.40, is over the
    worst pairing measured (27.6 / 76.3 = 0.36). Segments of 23 steps, sqrt(T), measured
    28.3 MiB."""
    peaks = fresh_results["lstm_peaks"]
    plain, memory, taped = peaks["plain"], peaks["memory"], peaks["tape"]
    print(f"LSTM: plain {plain / 2**20:.1f} MiB, memory {memory / 2**20:.1f} MiB "
          f"({memory / plain:.2f}x), tape {taped / 2**20:.1f} MiB")
    assert memory <= 0.40 * plain
    assert taped <= 0.40 * plain


@pytest.mark.memory
# With oneDNN's kernels and without, on an idle machine: plain 314 and 314 MiB, memory 89 and 94.
@pytest.mark.kernel_neutral
def test_a_long_scan_keeps_less_than_half_of_plain_backprops_peak(fresh_results):
    """A GRU written with tf.scan over 1,024 steps, segments of 16 steps. The floor is the
    scan's own stacked outputs, their gradient and the loss's intermediates (four [T, batch,
    units] tensors, 128 MiB), which no schedule of the loop removes. Measured with one
    inter-op thread: plain 314 MiB; memory 89-90 MiB (0.28x) on an idle machine, 130 MiB
    (0.41x, the four tensors alive at once) with both cores busy, whatever the segment
    length."""
    peaks = fresh_results["gru_scan_peaks"]
    plain, memory = peaks["plain"], peaks["memory"]
    print(f"tf.scan GRU: plain {plain / 2**20:.1f} MiB, memory {memory / 2**20:.1f} MiB "
          f"({memory / plain:.2f}x)")
    assert memory <= 0.45 * plain
