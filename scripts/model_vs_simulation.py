"""The memory model's predicted peaks against Grappler's simulation on real models.

For plain backprop, the 'memory' strategy's plan and the model's leanest plan (the least peak
any cut positions reach under the model, `Planner.smallest_feasible`, and the cheapest plan
there), on `scripts/first_call.py`'s models and
keras.applications ResNet50 (random init, a squared-output loss, every weight's gradient
held to the end of the backward): the model's predicted peak (`MemoryModel.predict`) and the
simulated one (what a `Budget` reads: Grappler's schedule of the traced step, no run), each
model in a fresh process. Nothing is run, so the figures are the same on every call. The
table is docs/budget.md's (the leanest plan's columns: also its recomputed FLOPs against
'memory''s, in forward passes, and the seconds the search took); ``--check`` exits non-zero when a prediction of plain backprop on a
convolutional network is more than 10% off its simulation.

    python scripts/model_vs_simulation.py                  # every model, a table
    python scripts/model_vs_simulation.py --model resnet50 --check
    python scripts/model_vs_simulation.py --model gpt2 --measure   # and each plan's real peak

``--measure`` also runs each plan in a step that returns every gradient (held, as the model
assumes) and prints its measured peak above the baseline and its time against plain
backprop's: the median and range of five calls, in the same process (TensorFlow's default
threads, or what ``TF_NUM_INTEROP_THREADS`` sets). It measures one more plan: the model's
cheapest cut positions at 'memory''s own modelled peak (gradients consumed as made).
``--apply`` (with ``--measure``): the step applies each gradient as it is made instead.

    python scripts/model_vs_simulation.py --model densenet121 --measure --apply
"""

import argparse
import json
import os
import statistics
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


def leanest_cuts(view, model):
    """``(cuts, modelled peak, recomputed FLOPs)`` of the memory model's leanest plan: the
    cheapest cut positions at the least peak any positions reach (`Planner.smallest_feasible`)."""
    from memgrad._src.checkpointing.budget_planner import Planner

    planner = Planner(view, model)
    return planner.plan(planner.smallest_feasible())


def figures(name):
    """``{plain_model, plain_simulated, memory_model, memory_simulated, leanest_model,
    leanest_simulated}`` in bytes, ``{memory_passes, leanest_passes}`` (recomputed FLOPs over
    the forward pass's) and ``leanest_seconds``."""
    import time

    import tensorflow as tf

    import memgrad
    from memgrad._src.checkpointing.budget_measure import peak_of, plain_gradients
    from memgrad._src.checkpointing.plans import absorb_bias, memory_plan
    from memgrad._src.graph import ForwardGraph, MemoryModel
    from memgrad._src.graph.kernels import measuring_device

    model, x = model_and_batch(name)
    out = {}

    # No autograph: it would convert (and time) the planner's Python called directly here;
    # memgrad.gradients is never converted (do_not_convert), the timing below is the user's.
    @tf.function(autograph=False)
    def step(t):
        loss = tf.reduce_mean(tf.square(model(t, training=True)))
        view = ForwardGraph([loss], model.trainable_variables)
        m, plan = MemoryModel(view), memory_plan(view)
        out["plain_model"] = m.predict([])[0]
        forward = float(m.flops.sum())
        out["memory_model"], memory_flops = m.predict(m.positions_of(plan.tensors))
        out["memory_passes"] = memory_flops / forward
        start = time.perf_counter()
        cuts, out["leanest_model"], leanest_flops = leanest_cuts(view, m)
        out["leanest_seconds"] = time.perf_counter() - start
        out["leanest_passes"] = leanest_flops / forward
        kernels = measuring_device()
        rewritten = memgrad.gradients(loss, model.trainable_variables, checkpoints=plan.tensors)
        leanest = memgrad.gradients(loss, model.trainable_variables,
                                    checkpoints=absorb_bias(view, m.tensors_for(cuts)))
        out["plain_simulated"] = peak_of(view, plain_gradients(view), kernels).bytes
        out["memory_simulated"] = peak_of(view, rewritten, kernels).bytes
        out["leanest_simulated"] = peak_of(view, leanest, kernels).bytes
        return loss

    spec = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), x)
    step.get_concrete_function(spec)
    return {k: float(v) if v is not None else None for k, v in out.items()}


def cheapest_at_memory_peak(view, model):
    """``(cuts, modelled peak, recomputed FLOPs)``: the model's cheapest cut positions whose
    modelled peak is at most the 'memory' placement's (`Planner.plan` at that peak)."""
    from memgrad._src.checkpointing.budget_planner import Planner
    from memgrad._src.checkpointing.plans import memory_cuts

    _, cuts = memory_cuts(model.profile)
    peak, _ = model.predict(cuts)
    return Planner(view, model).plan(peak)


def measured(name, calls=5, apply=False):
    """``{"peaks": {plan: [bytes per call]}, "seconds": {plan: [...]}}`` for plain backprop,
    'memory', the model's leanest plan and its cheapest plan at 'memory''s modelled peak
    (gradients consumed as made, the model's leanest case for activations), in a step that
    returns the loss and every gradient (held, as the model assumes), or with ``apply`` one
    that applies each gradient as it is made (an SGD ``assign_sub``, as Keras's optimizers
    do). Peaks are above the baseline; seconds are per call, timed in interleaved rounds after
    two warm-up calls (`benchmarks.common.time_rounds`)."""
    import tensorflow as tf

    import memgrad
    from memgrad._src.checkpointing.plans import absorb_bias
    from memgrad._src.graph import MemoryModel

    class Modelled(memgrad.strategies.Strategy):
        """A plan of the memory model: ``search(view, model)`` gives its cut positions."""

        def __init__(self, search, hold_gradients):
            self.search, self.hold_gradients = search, hold_gradients

        def plan(self, view):
            m = MemoryModel(view, hold_gradients=self.hold_gradients)
            cuts, _, _ = self.search(view, m)
            return memgrad.strategies.Tensors(absorb_bias(view, m.tensors_for(cuts))).plan(view)

    model, x = model_and_batch(name)
    variables = model.trainable_variables

    def step_of(tape):
        @tf.function
        def step(t):
            with tape() as recorder:
                loss = tf.reduce_mean(tf.square(model(t, training=True)))
            grads = recorder.gradient(loss, variables)
            if not apply:
                return loss, grads
            for variable, grad in zip(variables, grads):
                variable.assign_sub(1e-6 * tf.convert_to_tensor(grad))
            return loss, []
        return step

    plans = {"memory": "memory", "leanest": Modelled(leanest_cuts, True),
             "cheapest at 'memory''s peak": Modelled(cheapest_at_memory_peak, False)}
    steps = {"plain": step_of(tf.GradientTape)}
    steps.update({key: step_of(lambda c=c: memgrad.GradientTape(checkpoints=c))
                  for key, c in plans.items()})
    peaks = {key: [memgrad.profiler.measure(step, args=(x,)).peak_above_baseline_bytes
                   for _ in range(calls)] for key, step in steps.items()}
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from benchmarks.common import time_rounds

    losses = {key: lambda t, step=step: step(t)[0] for key, step in steps.items()}
    return {"peaks": peaks, "seconds": time_rounds(losses, x, calls)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, action="append")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--measure", action="store_true",
                        help="also measure each plan's peak and time (every gradient held)")
    parser.add_argument("--apply", action="store_true",
                        help="with --measure: a step that applies each gradient as it is made")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = figures(args.child)
        if args.measure:
            result["measured"] = measured(args.child, apply=args.apply)
        print("FIGURES " + json.dumps(result), flush=True)
        return 0
    failed = []
    print("| model | plain: simulated / model | 'memory': simulated / model, recomputed | "
          "leanest under the model: simulated / model, recomputed, search |")
    print("| --- | --- | --- | --- |")
    for name in args.model or MODELS:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT}
        command = [sys.executable, os.path.abspath(__file__), "--child", name]
        flags = ["--measure"] * args.measure + ["--apply"] * args.apply
        done = subprocess.run(command + flags, capture_output=True,
                              text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
        if done.returncode or not lines:
            print(f"| {name} | failed: {done.stderr.strip().splitlines()[-1:]} | |")
            failed.append(name)
            continue
        f = json.loads(lines[0][len("FIGURES "):])
        print(f"| {name} | {f['plain_simulated'] / MiB:.1f} / {f['plain_model'] / MiB:.1f} MiB | "
              f"{f['memory_simulated'] / MiB:.1f} / {f['memory_model'] / MiB:.1f} MiB, "
              f"{f['memory_passes']:.2f} passes | {f['leanest_simulated'] / MiB:.1f} / "
              f"{f['leanest_model'] / MiB:.1f} MiB, {f['leanest_passes']:.2f} passes, "
              f"{f['leanest_seconds']:.1f} s |", flush=True)
        runs = f.get("measured", {"peaks": {}})
        if runs["peaks"]:
            plain_time = statistics.median(runs["seconds"]["plain"])
        for key, peaks in runs["peaks"].items():
            peaks = sorted(p / MiB for p in peaks)
            ratios = sorted(t / plain_time for t in runs["seconds"][key])
            print(f"|   measured {key} | {statistics.median(peaks):.1f} MiB "
                  f"({peaks[0]:.1f}-{peaks[-1]:.1f}) | time {statistics.median(ratios):.2f}x "
                  f"({ratios[0]:.2f}-{ratios[-1]:.2f}) of plain | |", flush=True)
        if name in CONVOLUTIONAL and abs(f["plain_model"] / f["plain_simulated"] - 1) > 0.10:
            failed.append(name)
    if args.check and failed:
        print(f"missed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
