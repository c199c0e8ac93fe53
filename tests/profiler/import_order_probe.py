"""Fresh-process probes for tests/profiler/test_categories.py: `measure` in a process whose
environment sets nothing, with TensorFlow and memgrad imported in a given order; a conv net's
memory by category; an OOM report on the emulated device."""


def measure_after(order):
    """Imports in ``order`` ('memgrad first', 'tensorflow first', 'an op first'), then measures a
    step; returns the peak above the baseline, or the error's type and message."""
    if order == "memgrad first":
        import memgrad
        import tensorflow as tf
    else:
        import tensorflow as tf

        if order == "an op first":
            tf.ones([4]).numpy()  # TensorFlow starts its devices here, before memgrad is imported
        import memgrad
    step = tf.function(lambda x: tf.reduce_sum(tf.tanh(x) * 2.0))
    try:
        report = memgrad.profiler.measure(step, args=(tf.ones([512, 512]),), device="CPU:0")
    except Exception as error:  # noqa: BLE001 - reported to the test
        return {"error": type(error).__name__, "message": str(error)}
    return {"peak_above_baseline_bytes": report.peak_above_baseline_bytes}


def capped_oom_report():
    """A workload built to fail on the emulated 20 MiB device, with its OOM report."""
    from memgrad.profiler import run_capped

    run = run_capped("tests.profiler.capped_targets:fail_in_a_wide_layer", "20MiB", {"batch_size": 512},
                     explain=True)
    return {"fits": run.fits, "message": run.message,
            "report": None if run.oom_report is None else run.oom_report.as_dict(), "text": str(run.oom_report)}


def _peaks(step, x, calls=5):
    """`measure`'s peak of ``calls`` single calls: with oneDNN on, one step's peak moves by
    about 5% from call to call (27.9 and 29.5 MiB measured on the MLP with Adam)."""
    import memgrad

    return [memgrad.profiler.measure(step, x, device="CPU:0", warmup=0).peak_bytes for _ in range(calls)]


def conv_categories():
    """A conv net's step, plain and checkpointed: memory by category and `measure`'s peak, one op
    at a time (so that a step's peak, Eigen's convolution scratch included, repeats)."""
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    import memgrad
    from tests.profiler.test_categories import _conv_step

    x = tf.random.stateless_normal([32, 32, 32, 8], seed=[0, 2])
    found = {}
    for name, tape in (("plain", tf.GradientTape), ("memory", lambda: memgrad.GradientTape(checkpoints="memory"))):
        model, step = _conv_step(tape)
        split = memgrad.profiler.memory_by_category(step, x, weights=model.weights, device="CPU:0")
        found[name] = dict(split.as_dict(), total_bytes=split.total_bytes, measured_peaks=_peaks(step, x),
                           weights_expected=sum(int(v.numpy().nbytes) for v in model.weights))
    return found


def mlp_categories():
    """An MLP's step with Adam: memory by category and `measure`'s peak, one op at a time."""
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import memgrad
    from tests.profiler.test_categories import _mlp_step, _variable_bytes

    optimizer = keras.optimizers.Adam()
    model, step = _mlp_step(optimizer)
    x = tf.random.stateless_normal([256, 512], seed=[0, 1])
    step(x)  # builds the optimizer's slots
    split = memgrad.profiler.memory_by_category(step, x, weights=model.weights,
                                                optimizer_variables=optimizer.variables, device="CPU:0")
    return dict(split.as_dict(), total_bytes=split.total_bytes, measured_peaks=_peaks(step, x),
                weights_expected=_variable_bytes(model.weights),
                optimizer_expected=_variable_bytes(optimizer.variables), text=str(split))
