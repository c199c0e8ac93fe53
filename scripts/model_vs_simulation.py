"""The memory model's predicted peaks against Grappler's simulation on real models.

For plain backprop and the 'memory' strategy's plan, on `scripts/first_call.py`'s models and
keras.applications ResNet50 (random init, a squared-output loss, every weight's gradient
held to the end of the backward): the model's predicted peak (`MemoryModel.predict`) and the
simulated one (what a `Budget` reads: Grappler's schedule of the traced step, no run), each
model in a fresh process. Nothing is run, so the figures are the same on every call. The
table is docs/budget.md's; ``--check`` exits non-zero when a prediction of plain backprop on a
convolutional network is more than 10% off its simulation.

    python scripts/model_vs_simulation.py                  # every model, a table
    python scripts/model_vs_simulation.py --model resnet50 --check
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("resnet50", "vgg16", "inceptionv3", "densenet121", "gpt2", "chain1024")
CONVOLUTIONAL = ("resnet50", "vgg16", "inceptionv3", "densenet121")
MiB = 2**20


def model_and_batch(name):
    if name != "resnet50":
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        from first_call import model_and_batch as first_call_model

        return first_call_model(name)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    return model, tf.random.stateless_normal([8, 64, 64, 3], seed=[0, 1])


def figures(name):
    """``{plain_model, plain_simulated, memory_model, memory_simulated}`` in bytes."""
    import tensorflow as tf

    import memgrad
    from memgrad._src.checkpointing.budget_measure import peak_of, plain_gradients
    from memgrad._src.checkpointing.plans import memory_plan
    from memgrad._src.graph import ForwardGraph, MemoryModel
    from memgrad._src.graph.kernels import measuring_device

    model, x = model_and_batch(name)
    out = {}

    @tf.function
    def step(t):
        loss = tf.reduce_mean(tf.square(model(t, training=True)))
        view = ForwardGraph([loss], model.trainable_variables)
        m, plan = MemoryModel(view), memory_plan(view)
        out["plain_model"] = m.predict([])[0]
        out["memory_model"] = m.predict(m.positions_of(plan.tensors))[0]
        kernels = measuring_device()
        rewritten = memgrad.gradients(loss, model.trainable_variables, checkpoints=plan.tensors)
        out["plain_simulated"] = peak_of(view, plain_gradients(view), kernels).bytes
        out["memory_simulated"] = peak_of(view, rewritten, kernels).bytes
        return loss

    spec = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), x)
    step.get_concrete_function(spec)
    return {k: float(v) if v is not None else None for k, v in out.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, action="append")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("FIGURES " + json.dumps(figures(args.child)), flush=True)
        return 0
    failed = []
    print("| model | plain: simulated / model | 'memory': simulated / model |")
    print("| --- | --- | --- |")
    for name in args.model or MODELS:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT}
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name],
                              capture_output=True, text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
        if done.returncode or not lines:
            print(f"| {name} | failed: {done.stderr.strip().splitlines()[-1:]} | |")
            failed.append(name)
            continue
        f = json.loads(lines[0][len("FIGURES "):])
        print(f"| {name} | {f['plain_simulated'] / MiB:.1f} / {f['plain_model'] / MiB:.1f} MiB | "
              f"{f['memory_simulated'] / MiB:.1f} / {f['memory_model'] / MiB:.1f} MiB |", flush=True)
        if name in CONVOLUTIONAL and abs(f["plain_model"] / f["plain_simulated"] - 1) > 0.10:
            failed.append(name)
    if args.check and failed:
        print(f"missed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
