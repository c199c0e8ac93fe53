"""The memory model against what runs, on models nobody here wrote: docs/budget.md's accuracy table.

For each model (keras.applications with ``weights=None``, keras-hub backbones with random
weights, Keras LSTM and GRU stacks; three under ``mixed_float16``), in a fresh process, a
`tf.function` training step (``memgrad.GradientTape``, the mean square of the output, Keras's
SGD ``optimizer.apply``) is measured as users measure it: the allocator's peak above what
was held before the call (`memgrad.profiler.measure_runs`, median of ``--calls`` calls), for

- plain backprop (``tf.GradientTape``),
- the 'memory' strategy,
- ``Budget(1.1 x 'memory''s measured peak)`` ("never refuse what 'memory' reaches"),
- ``Budget(half-way between 'memory''s and plain's measured peaks)``,

each next to the memory model's figures for it (plain's and 'memory''s from the model of the
traced step, with the weights' gradients held to the end of the backward pass, as a default
Budget plans, and consumed as made, ``hold_gradients=False``; a Budget's, the plan's
``predicted_bytes``). The Budgets are the default ones (gradients held); a refused budget is
a row's ``error``. Keras's SGD applies each gradient once TensorFlow's executor gets to its
update, which it queues behind the backward pass's own ops: the measured peak lies between
the two models where the gradients are large.

    python scripts/model_accuracy.py                     # every model, two at a time
    python scripts/model_accuracy.py --models resnet50 gpt2 --jobs 1
    python scripts/model_accuracy.py --out docs/model_accuracy.json --table

``--check`` exits non-zero when a row's plain or 'memory' figure is off by more than 10%,
a Budget 10% above 'memory' is refused, or an accepted budget is overrun.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys

MiB = 2**20

# name: (builder, image size or sequence length, batch, dtype policy)
MODELS = {
    "resnet50": ("ResNet50", 64, 8, None),
    "resnet50v2": ("ResNet50V2", 64, 8, None),
    "inceptionv3": ("InceptionV3", 96, 8, None),
    "xception": ("Xception", 96, 8, None),
    "vgg16": ("VGG16", 64, 16, None),
    "densenet121": ("DenseNet121", 64, 8, None),
    "mobilenetv2": ("MobileNetV2", 96, 16, None),
    "mobilenetv3small": ("MobileNetV3Small", 96, 16, None),
    "efficientnetb0": ("EfficientNetB0", 64, 16, None),
    "efficientnetv2b0": ("EfficientNetV2B0", 64, 16, None),
    "nasnetmobile": ("NASNetMobile", 64, 8, None),
    "convnexttiny": ("ConvNeXtTiny", 64, 8, None),
    "resnet101v2": ("ResNet101V2", 64, 8, None),
    "gpt2": ("gpt2", 128, 8, None),
    "bert": ("bert", 128, 8, None),
    "llama": ("llama", 128, 8, None),
    "lstm": ("lstm", 128, 32, None),
    "gru": ("gru", 128, 32, None),
    "resnet50_fp16": ("ResNet50", 64, 8, "mixed_float16"),
    "gpt2_fp16": ("gpt2", 128, 8, "mixed_float16"),
    "lstm_fp16": ("lstm", 128, 32, "mixed_float16"),
}


def build(name):
    """``(model, inputs)`` for a name of `MODELS`, seeded, no downloads."""
    import keras
    import tensorflow as tf

    kind, size, batch, policy = MODELS[name]
    keras.utils.set_random_seed(0)
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    tokens = {"token_ids": tf.ones([batch, size], tf.int32), "padding_mask": tf.ones([batch, size], tf.int32)}
    if kind in ("gpt2", "bert", "llama"):
        import keras_hub

        common = dict(vocabulary_size=1000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)
        if kind == "gpt2":
            model = keras_hub.models.GPT2Backbone(max_sequence_length=size, **common)
        elif kind == "bert":
            model = keras_hub.models.BertBackbone(max_sequence_length=size, **common)
            tokens["segment_ids"] = tf.zeros([batch, size], tf.int32)
        else:
            common["num_query_heads"] = common.pop("num_heads")
            model = keras_hub.models.LlamaBackbone(num_key_value_heads=2, **common)
        return model, tokens
    if kind in ("lstm", "gru"):
        layer = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
        model = keras.Sequential([keras.Input((size, 64)), layer(256, return_sequences=True), layer(256),
                                  keras.layers.Dense(10)])
        return model, tf.random.stateless_normal([batch, size, 64], seed=[0, 1])
    application = getattr(keras.applications, kind)
    model = application(weights=None, input_shape=(size, size, 3), classes=10)
    return model, tf.random.stateless_normal([batch, size, size, 3], seed=[0, 1])


def _output(model, inputs):
    import tensorflow as tf

    out = model(inputs, training=True)
    if isinstance(out, dict):
        out = out["sequence_output"]
    return tf.cast(out, tf.float32)


def modelled(model, inputs):
    """The memory model's plain and 'memory' peaks of the step's gradient, with the weights'
    gradients held to the end of the backward pass (``held``, what a default Budget plans
    on) and consumed as made (``consumed``, ``hold_gradients=False``): a trace, nothing runs."""
    import tensorflow as tf

    from memgrad._src.checkpointing.budget_planner import Planner
    from memgrad._src.checkpointing.plans import memory_plan
    from memgrad._src.graph import ForwardGraph
    from memgrad._src.graph.kernels import measuring_device

    found = {}

    @tf.function
    def trace(inputs):
        loss = tf.reduce_mean(tf.square(_output(model, inputs)))
        view = ForwardGraph([loss], model.trainable_variables)
        cuts = None
        for hold, key in ((True, "held"), (False, "consumed")):
            m = Planner(view, hold_gradients=hold, kernels=measuring_device()).model
            cuts = m.positions_of(memory_plan(view).tensors) if cuts is None else cuts
            found[f"plain_{key}"] = m.predict([])[0] / MiB
            found[f"memory_{key}"] = m.predict(cuts)[0] / MiB
        return loss

    trace.get_concrete_function(inputs)
    return found


def measure_model(name, calls):
    """One model's row: ``{variant: {measured, range, modelled, ...}}``."""
    import keras
    import tensorflow as tf

    import memgrad

    model, inputs = build(name)
    optimizer = keras.optimizers.SGD(1e-4)
    row = {"model": name, "policy": MODELS[name][3],
           "onednn": memgrad.profiler.check_half_precision_kernels().onednn,
           "parameters_MiB": sum(v.numpy().nbytes for v in model.trainable_variables) / MiB}

    def run(label, make_tape):
        @tf.function
        def step(inputs):
            with make_tape() as tape:
                loss = tf.reduce_mean(tf.square(_output(model, inputs)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        info = {}
        try:
            with memgrad.record_rewrites() as log:
                step(inputs)
            peaks = sorted(r.peak_above_baseline_bytes / MiB for r in memgrad.profiler.measure_runs(
                step, (inputs,), device="CPU:0", repeats=calls))
        except memgrad.BudgetError as error:
            info["error"] = str(error).split(". Expected")[0]
            info["smallest_feasible_MiB"] = (error.smallest_feasible_bytes or 0) / MiB
        else:
            info["measured"] = peaks[len(peaks) // 2]
            info["range"] = [peaks[0], peaks[-1]]
            plans = [r.plan for r in log if r.plan is not None]
            if plans and "predicted_bytes" in plans[-1].details:
                info["modelled"] = plans[-1].details["predicted_bytes"] / MiB
                info["recomputed_ops"] = sum(r.recomputed_ops for r in log)
        row[label] = info
        return info

    model_figures = modelled(model, inputs)
    plain = run("plain", tf.GradientTape)
    memory = run("memory", lambda: memgrad.GradientTape(checkpoints="memory"))
    for label, info in (("plain", plain), ("memory", memory)):
        info["modelled"] = model_figures[f"{label}_held"]
        info["modelled_consumed"] = model_figures[f"{label}_consumed"]
    for label, budget in (("budget_memory_1.1", 1.1 * memory["measured"]),
                          ("budget_halfway", (memory["measured"] + plain["measured"]) / 2)):
        strategy = memgrad.strategies.Budget(int(budget * MiB))
        info = run(label, lambda strategy=strategy: memgrad.GradientTape(checkpoints=strategy))
        info["budget"] = budget  # MiB
    return row


def _in_fresh_process(name, calls):
    from memgrad._src.profiler.fresh import FreshProcessError, run_in_fresh_process

    try:
        return run_in_fresh_process("model_accuracy:measure_model", [name, calls], timeout=3600,
                                    env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    except FreshProcessError as error:
        return {"model": name, "failure": str(error)[-2000:]}


def misses(row):
    """The row's missed claims, as sentences."""
    found = []
    for label in ("plain", "memory"):
        info = row.get(label, {})
        if "measured" in info and abs(info["modelled"] / info["measured"] - 1) > 0.10:
            found.append(f"{label} modelled {info['modelled']:.1f} MiB vs measured {info['measured']:.1f}")
    if "error" in row.get("budget_memory_1.1", {}):
        found.append("a budget 10% above 'memory''s measured peak was refused")
    for label in ("budget_memory_1.1", "budget_halfway"):
        info = row.get(label, {})
        if "measured" in info and info["measured"] > info["budget"]:
            found.append(f"{label}: measured {info['measured']:.1f} MiB over the budget {info['budget']:.1f}")
    return found


def table(rows):
    """docs/budget.md's table of ``rows`` (MiB; modelled: gradients consumed as made - held to
    the end; held / measured in brackets)."""
    lines = ["| model | plain: modelled | measured | 'memory': modelled | measured | "
             "Budget(1.1 x 'memory' measured): budget, measured | Budget(half-way): budget, measured |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def model_cells(info):
        return [f"{info['modelled_consumed']:.1f}-{info['modelled']:.1f} "
                f"({info['modelled'] / info['measured']:.2f}x)",
                f"{info['measured']:.1f} ({info['range'][0]:.1f}-{info['range'][1]:.1f})"]

    def budget_cell(info):
        if "error" in info:
            return f"{info['budget']:.1f}: refused, least {info['smallest_feasible_MiB']:.1f}"
        verdict = "held" if info["measured"] <= info["budget"] else "**over**"
        return f"{info['budget']:.1f}: {info['measured']:.1f}, {verdict}"

    for row in rows:
        if "failure" in row:
            lines.append(f"| {row['model']} | failed: {row['failure'].splitlines()[-1][:80]} |||||")
            continue
        name = row["model"] + (f" ({row['policy']})" if row.get("policy") else "")
        cells = [name, *model_cells(row["plain"]), *model_cells(row["memory"]),
                 budget_cell(row["budget_memory_1.1"]), budget_cell(row["budget_halfway"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--table", default=None, help="print the table of a JSON file --out wrote")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return 0
    rows = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(_in_fresh_process, name, args.calls) for name in args.models]
        for future in concurrent.futures.as_completed(futures):
            rows.append(future.result())
            print(json.dumps(rows[-1]), flush=True)
    rows.sort(key=lambda row: args.models.index(row["model"]))
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    missed = [f"{row['model']}: {text}" for row in rows for text in misses(row)]
    missed += [f"{row['model']}: failed" for row in rows if "failure" in row]
    for text in missed:
        print("missed:", text)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
