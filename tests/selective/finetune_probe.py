"""Fine-tuning workloads and their step peaks in a fresh process.

ResNet50 and MobileNetV2 from keras.applications (weights=None) under a trainable head, and a
keras-hub BERT backbone (random init, no preset) with trainable adapters between its frozen
encoder layers. Each peak is the least of a few measured steps after one warm-up, in a process
with one inter-op thread (a fixed graph schedule: memory_probe.py).
"""

import collections
import time

import keras
import tensorflow as tf

import memgrad

TRAINING = True  # dropout on in the BERT workload (fine-tuning)


def image_model(name, size=32, tuning="frozen"):
    """``keras.applications.<name>`` (no top) under GlobalAveragePooling2D + Dense(10).

    tuning: "frozen" (backbone frozen, head trained) or "batchnorm" (only the backbone's
    BatchNormalization layers and the head trained: gradients flow through frozen convolutions).
    """
    keras.utils.set_random_seed(0)
    base = getattr(keras.applications, name)(include_top=False, weights=None, input_shape=(size, size, 3))
    for layer in base.layers:
        layer.trainable = tuning == "batchnorm" and isinstance(layer, keras.layers.BatchNormalization)
    inputs = keras.Input((size, size, 3))
    features = keras.layers.GlobalAveragePooling2D()(base(inputs, training=False))
    return keras.Model(inputs, keras.layers.Dense(10)(features))


def bert_with_adapters(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=256, sequence_length=64,
                       adapter_dim=8):
    """A keras-hub BertBackbone's frozen layers with a trainable bottleneck adapter after every
    encoder layer, and a trainable head on the [CLS] token: gradients flow through frozen
    encoder layers down to the first adapter."""
    import keras_hub  # test-only dependency

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=1000, num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim, max_sequence_length=sequence_length)
    backbone.trainable = False
    token_ids = keras.Input((sequence_length,), dtype="int32", name="token_ids")
    segment_ids = keras.Input((sequence_length,), dtype="int32", name="segment_ids")
    padding_mask = keras.Input((sequence_length,), dtype="int32", name="padding_mask")
    tokens = backbone.get_layer("token_embedding")(token_ids)
    x = backbone.get_layer("embeddings_add")((tokens, backbone.get_layer("position_embedding")(tokens),
                                              backbone.get_layer("segment_embedding")(segment_ids)))
    x = backbone.get_layer("embeddings_dropout")(backbone.get_layer("embeddings_layer_norm")(x))
    for i in range(num_layers):
        x = backbone.get_layer(f"transformer_layer_{i}")(x, padding_mask=padding_mask)
        bottleneck = keras.layers.Dense(adapter_dim, activation="relu", name=f"adapter_{i}_down")(x)
        x = keras.layers.Add(name=f"adapter_{i}_add")([x, keras.layers.Dense(hidden_dim, name=f"adapter_{i}_up")(bottleneck)])
    logits = keras.layers.Dense(2, name="head")(x[:, 0, :])
    return keras.Model({"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}, logits)


def _batch(model, batch):
    if isinstance(model.input, dict):
        length = model.input["token_ids"].shape[1]
        ids = tf.random.stateless_uniform([batch, length], seed=[0, 1], maxval=1000, dtype=tf.int32)
        return {"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": tf.ones_like(ids)}, TRAINING
    size = model.input.shape[1]
    return tf.random.stateless_normal([batch, size, size, 3], seed=[0, 1]), False


def make_step(model, batch, graph=False):
    """An SGD training step of ``model`` (eager, or traced with ``graph``)."""
    x, training = _batch(model, batch)
    y = tf.range(batch) % 2
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)

    def step():
        with tf.GradientTape() as tape:
            logits = model(x, training=training)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return tf.function(step) if graph else step


def step_peak(model, batch, graph=False, calls=2, step=None):
    """The least peak of ``calls`` measured steps (one warm-up); ``step``: one from `make_step`."""
    step = step or make_step(model, batch, graph)
    return min(memgrad.profiler.measure(step, warmup=int(i == 0)).peak_above_baseline_bytes for i in range(calls))


def requested_peak(model, batch, graph=True, step=None):
    """The most bytes *requested* by live allocations made during one profiled step
    (`PeakTensors.requested_peak_bytes`).

    The allocator's own peak counts whole BFC chunks, and a chunk can be up to twice the
    request depending on what is free: the same graph measured 9.3-10.5 MiB across
    processes. Replaying the profiler's allocation events with the requested sizes gives
    the same figure for the same schedule.
    """
    step = step or make_step(model, batch, graph)
    return memgrad.profiler.largest_live_tensors(step, (), k=1, device="CPU:0").requested_peak_bytes


def step_seconds(model, batch, graph=False, rounds=5):
    """The median wall time of ``rounds`` steps after two warm-up steps."""
    step = make_step(model, batch, graph)
    step(), step()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


WORKLOADS = {
    "resnet50_frozen": (lambda: image_model("ResNet50", 32, "frozen"), 8),
    "resnet50_batchnorm": (lambda: image_model("ResNet50", 32, "batchnorm"), 8),
    "mobilenetv2_frozen": (lambda: image_model("MobileNetV2", 32, "frozen"), 8),
    "bert_adapters": (lambda: bert_with_adapters(), 8),
}


def eager_peaks(names):
    """{name: [Keras eager peak, converted eager peak]} in bytes."""
    tf.config.threading.set_inter_op_parallelism_threads(1)
    results = {}
    for name in names:
        build, batch = WORKLOADS[name]
        model = build()
        converted = memgrad.selective.convert(model)
        results[name] = [step_peak(m, batch, calls=1) for m in (model, converted)]
    return results


def op_types(step):
    """{op type: count} of a traced training step (a `make_step` with ``graph=True``)."""
    graph = step.get_concrete_function().graph
    return dict(collections.Counter(op.type for op in graph.get_operations()))


def graph_peaks(names, calls=1):
    """{name: {"peaks": [Keras, converted], "requested_peaks": [Keras, converted],
    "op_difference": {type: [Keras count, converted count]}}} of a graph-mode (tf.function)
    training step (each model's step traced once); both models are built before either is
    measured, so the allocator holds the same weights for both."""
    tf.config.threading.set_inter_op_parallelism_threads(1)
    results = {}
    for name in names:
        build, batch = WORKLOADS[name]
        model = build()
        converted = memgrad.selective.convert(model)
        steps = [make_step(m, batch, graph=True) for m in (model, converted)]
        keras_ops, converted_ops = (op_types(step) for step in steps)
        difference = {t: [keras_ops.get(t, 0), converted_ops.get(t, 0)] for t in set(keras_ops) | set(converted_ops)
                      if keras_ops.get(t, 0) != converted_ops.get(t, 0)}
        results[name] = {
            "peaks": [step_peak(m, batch, calls=calls, step=step) for m, step in zip((model, converted), steps)],
            "requested_peaks": [requested_peak(m, batch, step=step) for m, step in zip((model, converted), steps)],
            "op_difference": difference}
    return results
