"""First-call cost: trace, plan and first step of memgrad's strategies against plain backprop.

A training step's first call traces the model, builds the gradient and runs once; with memgrad
it also analyses the graph, plans what to keep and builds the recomputation. Each first call
runs in a fresh process (nothing traced, cached or warmed up before it), the variants take turns
round after round, and the table shows the median of the rounds. Each process then measures the
second call's peak (above what exists before it): for a Budget, the table gives the range of
those peaks over the rounds against the budget, and how many rounds held it (peak <= 1.05 x
the budget).

    python scripts/first_call.py                       # every model below, 3 rounds
    python scripts/first_call.py --model chain1024 --rounds 5
    python scripts/first_call.py --model gpt2 --variant "Budget(0.5)" --rounds 20
    python scripts/first_call.py --model vgg16 --variant "Budget(0.5, hold_gradients=False)"

The step applies each gradient as it is made (one `assign_sub` per variable), so a Budget
that counts every gradient held to the end (the default) over-counts it; `hold_gradients=False`
plans for this step. The target is TARGET x plain's first call for every variant (a Budget's
planning included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

MODELS = {
    "chain1024": "Keras Sequential of 1,024 Dense(64, relu) layers, batch 256x64",
    "densenet121": "keras.applications.DenseNet121 (random init), batch 8x64x64x3",
    "densenet169": "keras.applications.DenseNet169 (random init), batch 8x64x64x3",
    "gpt2": "keras-hub GPT2Backbone 6x384 (random init), batch 8x128 tokens",
    "inceptionv3": "keras.applications.InceptionV3 (random init), batch 8x96x96x3",
    "vgg16": "keras.applications.VGG16 (random init), batch 16x64x64x3",
}
TARGET = 1.5
MiB = 2**20
VARIANTS = ("plain", "memory", "speed", "Budget(0.5)")  # any Budget(<fraction>) is accepted


def model_and_batch(name):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    if name == "chain1024":
        # Keras builds a Sequential's graph map recursively, a few frames per layer: 1,024
        # layers pass Python's default limit of 1,000 frames (RecursionError).
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
        model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(64, activation="relu")
                                                         for _ in range(1024)] + [keras.layers.Dense(1)])
        return model, tf.random.stateless_normal([256, 64], seed=[0, 1])
    if name == "gpt2":
        import keras_hub

        model = keras_hub.models.GPT2Backbone(vocabulary_size=1000, num_layers=6, num_heads=6, hidden_dim=384,
                                              intermediate_dim=1536, max_sequence_length=128)
        return model, {"token_ids": tf.ones([8, 128], tf.int32), "padding_mask": tf.ones([8, 128], tf.int32)}
    application, size, batch = {"densenet121": (keras.applications.DenseNet121, 64, 8),
                                "densenet169": (keras.applications.DenseNet169, 64, 8),
                                "inceptionv3": (keras.applications.InceptionV3, 96, 8),
                                "vgg16": (keras.applications.VGG16, 64, 16)}[name]
    model = application(weights=None, input_shape=(size, size, 3), classes=10)
    return model, tf.random.stateless_normal([batch, size, size, 3], seed=[0, 1])


_BUDGET = re.compile(r"Budget\((0?\.\d+|1(?:\.0*)?)(, hold_gradients=False)?\)")


def _variant(text):
    if text in VARIANTS[:3] or _BUDGET.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"expected plain, memory, speed, Budget(<fraction>) or "
                                     f"Budget(<fraction>, hold_gradients=False); received {text!r}")


def _tape(variant):
    import tensorflow as tf

    import memgrad

    if variant == "plain":
        return tf.GradientTape()
    match = _BUDGET.fullmatch(variant)
    if match:
        return memgrad.GradientTape(checkpoints=memgrad.strategies.Budget(
            float(match.group(1)), hold_gradients=not match.group(2)))
    return memgrad.GradientTape(checkpoints=variant)


def sgd_step(model, make_tape):
    """A `tf.function` SGD step on the mean square of ``model``'s output, under the tape
    ``make_tape()`` returns, applying each gradient as it is made (one `assign_sub` each)."""
    import tensorflow as tf

    @tf.function
    def step(t):
        with make_tape() as tape:
            loss = tf.reduce_mean(tf.square(model(t, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        for variable, grad in zip(model.trainable_variables, grads):
            variable.assign_sub(1e-4 * tf.convert_to_tensor(grad))  # GPT-2's embedding: IndexedSlices
        return loss

    return step


def measure_one(name, variant) -> dict:
    """Seconds of the first and second call of one SGD step (run in a fresh process)."""
    import memgrad  # noqa: F401 - imported before the model, as a user's script does

    model, x = model_and_batch(name)
    step = sgd_step(model, lambda: _tape(variant))
    with memgrad.record_rewrites() as log:
        start = time.perf_counter()
        step(x).numpy()
        first = time.perf_counter() - start
    (second,) = memgrad.profiler.measure_runs(step, (x,), warmup=0, repeats=1)
    budgets = [r.plan.details["budget_bytes"] for r in log if r.plan is not None and r.mode == "budget"]
    return {"first_s": first, "second_s": second.wall_time_s, "peak": second.peak_above_baseline_bytes,
            "budget": budgets[0] if budgets else None, "copied": sum(r.copied_ops for r in log),
            "recomputed": sum(r.recomputed_ops for r in log)}


def _in_fresh_process(name, variant) -> dict:
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import first_call; "
            "print('RESULT ' + json.dumps(first_call.measure_one(sys.argv[2], sys.argv[3])))")
    run = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)), name, variant],
                         capture_output=True, text=True, check=False)
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    text = run.stderr.strip() or run.stdout.strip() or "no output"
    refusal = re.search(r"BudgetError: .*?(Expected a (?:budget|fraction) of at least [^:]*?\))", text, re.S)
    if refusal:  # the budget is below every plan: the least that fits, as the error names it
        return {"failure": "refused: " + refusal.group(1)}
    return {"failure": text.splitlines()[-1][:200]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), action="append", help="default: all")
    parser.add_argument("--variant", type=_variant, action="append",
                        help=f"one of {', '.join(VARIANTS[:3])}, Budget(<fraction>) or "
                             f"Budget(<fraction>, hold_gradients=False) (default: {', '.join(VARIANTS)})")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per variant (default: 3)")
    args = parser.parse_args(argv)
    variants = args.variant or list(VARIANTS)
    if "plain" not in variants:
        variants = ["plain"] + variants
    print("| model | variant | first call vs plain's | first call s | second call s | peak MiB: min / median / max"
          " | budget MiB | rounds within 1.05x budget | ops recomputed (copied) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.model or sorted(MODELS):
        results = {variant: [] for variant in variants}
        for _ in range(args.rounds):
            for variant in variants:
                results[variant].append(_in_fresh_process(name, variant))
        plain_runs = [r["first_s"] for r in results["plain"] if "first_s" in r]
        if not plain_runs:
            print(f"| {MODELS[name]} | plain | failed: {results['plain'][0]['failure']} | | | | | | |")
            continue
        plain = statistics.median(plain_runs)
        for variant in variants:
            done = [r for r in results[variant] if "first_s" in r]
            if not done:
                print(f"| {MODELS[name]} | {variant} | failed: {results[variant][0]['failure']} | | | | | | |")
                continue
            first = statistics.median(r["first_s"] for r in done)
            second = statistics.median(r["second_s"] for r in done)
            ratio = first / plain
            verdict = "" if variant == "plain" else (" (met)" if ratio <= TARGET else " (missed)")
            peaks = sorted(r["peak"] / MiB for r in done)
            spread = f"{peaks[0]:.1f} / {statistics.median(peaks):.1f} / {peaks[-1]:.1f}"
            budget = done[0]["budget"]
            held = ("" if budget is None else
                    f"{sum(r['peak'] <= 1.05 * r['budget'] for r in done)} of {len(done)}")
            ops = sorted({(r["recomputed"], r["copied"]) for r in done})  # one plan per variant: deterministic
            ops = ", ".join(f"{recomputed} ({copied})" for recomputed, copied in ops)
            print(f"| {MODELS[name]} | {variant} | {ratio:.2f}x{verdict} | {first:.1f} | {second:.2f} | {spread} | "
                  f"{'' if budget is None else f'{budget / MiB:.1f}'} | {held} | {ops} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
