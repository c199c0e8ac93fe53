"""`memgrad-profile`: what would make my model fit, and what does it cost?

Profiles one training step of a model under each memory strategy over a sweep of depths and
batch sizes, prints a table (peak memory, ratio to plain backprop, time per step, overhead),
writes JSON and a PNG plot; ``--budget`` finds the largest batch that fits a memory budget per
strategy on an emulated device of that size; ``--top K`` lists the largest tensors alive at the
peak. With the reversible strategy it also reports, per reversible stack, how far one training
step's rebuilt activations drift from the forward pass's, block by block. Run
``memgrad-profile --help`` for every option.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import sys

from memgrad.profiler import CATEGORIES
from memgrad.cli.arguments import (  # noqa: F401 - the tests read the parser's helpers here
    FAST_STEP_S, SLOW_STEP_ROUNDS, SLOW_STEP_S, TIMED_ROUNDS, budget_argument, build_parser)
from memgrad.cli.budget import find_budget_batches
from memgrad.cli.timing import time_side_by_side, time_steps
from memgrad.cli.report import (
    MB, MIB, PEAK_BASIS, format_budget, format_categories, format_oom, format_table, format_top, one_line, plot,
    half_precision_kernels, point, profiled_at)

HEADLINE_STRATEGIES = ("plain", "memory", "reversible")
# Printed under the table when the selective strategy was asked for.
SELECTIVE_NOTE = ("selective: these steps run inside a tf.function, where TensorFlow's graph gradients already "
                  "keep only what is needed, so selective layers save nothing here; they save memory in eager "
                  "steps (docs/selective.md)")


def _rerun_with_exact_cpu_stats(argv) -> None:
    """Re-executes this command with the BFC CPU allocator, whose statistics count every byte
    (and, under an allocator cap, without oneDNN: `_onednn_under_a_cap`).

    Importing memgrad asks for that allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``) while
    TensorFlow has not started its devices, so the command normally runs in this process. Only
    when ``main`` is called in a process whose TensorFlow already chose its allocator without
    the variable does the command start itself again.
    """
    changes = {}
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") is None:
        changes["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    if _onednn_under_a_cap() and os.environ.get(ONEDNN_VARIABLE) is None:
        changes[ONEDNN_VARIABLE] = "0"  # see _onednn_under_a_cap
    if changes:
        env = dict(os.environ, **changes)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.execve(sys.executable, [sys.executable, "-m", "memgrad.cli", *argv], env)


CAP_VARIABLE = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"


def _onednn_under_a_cap() -> bool:
    """Whether oneDNN's kernels run under a capped CPU allocator (an emulated small device).

    There, a oneDNN kernel whose allocation fails crashes the process (a segfault after
    "OP_REQUIRES failed at mkl_util.h", TensorFlow 2.21) instead of raising
    ResourceExhaustedError, so a point that runs out of memory could not be reported. The
    launcher (``memgrad_profile``) and `_rerun_with_exact_cpu_stats` turn oneDNN off under a
    cap unless ``TF_ENABLE_ONEDNN_OPTS`` is set.
    """
    from memgrad.profiler import onednn_enabled

    return bool(os.environ.get(CAP_VARIABLE)) and bool(onednn_enabled())


def _quiet_tensorflow() -> None:
    """Keeps TensorFlow's and Keras's log lines and warnings out of the command's output.

    C++ log lines below ERROR (TF_CPP_MIN_LOG_LEVEL, read when TensorFlow logs first, which
    happens when it starts its devices), Python log records below ERROR (retracing notices)
    and Python warnings raised inside TensorFlow or Keras. memgrad's own warnings still show.
    """
    import logging
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    for module in ("keras", "tensorflow", "tf_keras", "absl"):
        warnings.filterwarnings("ignore", module=module)


def _progress(total, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the [cli] extra is not installed: no bar, same results
        return None
    # Counted in profiled points (a strategy at one depth and batch size: a trace, the profiled
    # steps and the timed ones), said in words: a rate per point would read as a step's time.
    return tqdm(total=total, desc="memgrad-profile", file=sys.stderr, leave=False,
                bar_format="{desc}: {n} of {total} points profiled |{bar}| {elapsed} so far, about {remaining} "
                           "left{postfix}")


def run_sweep(spec, strategies, depths, batch_sizes, device, repeats=3, progress=True, top=None):
    """Measures every (depth, batch size, strategy) point of a sweep.

    Each point's step runs ``repeats`` times under TensorFlow's profiler: the step with the
    highest peak gives the point's peak, its memory by category and, with ``top``, its largest
    tensors (one and the same step). Each workload is profiled alone. Steps faster than
    `FAST_STEP_S` are then rebuilt and timed side by side with the point's other strategies
    (`time_steps`), slower ones alone right after profiling.

    Args:
      spec: a `memgrad.cli.sweep.ModelSpec`.
      strategies: strategies to measure (``'plain'`` first gives the ratios).
      depths: depths (``[None]`` for a model without depth).
      batch_sizes: batch sizes.
      device: the device to measure on.
      repeats: profiled steps per point; the one with the highest peak is reported.
      progress: show a progress bar on stderr.
      top: ``(depth, batch_size, k)``: list the ``k`` largest tensors alive at the peak of the
        points at that depth and batch size, from the same profiled step as the categories.

    Returns:
      A list of row dicts: ``model``, ``strategy``, ``depth``, ``batch_size``, ``peak_bytes``,
      ``peak_above_baseline_bytes``, ``ms_per_step``, ``time_spread`` (relative spread of the
      timed rounds), ``memory_ratio`` and ``time_overhead`` (to plain backprop at the same
      point, ``None`` without a plain row), ``out_of_memory``, ``categories`` (bytes by
      category at the peak) and ``oom_report`` (what was alive when the step ran out of memory).
      With ``top``, those points also carry ``top`` (the profiled peak above the baseline and
      the largest tensors).
    """
    rows = []
    bar = _progress(len(depths) * len(batch_sizes) * len(strategies), progress)
    # measure() collects garbage around every call; with TensorFlow and Keras imported that
    # walks ~0.3 s of long-lived objects each time. Parking them out of the collector's sight
    # (gc.freeze) leaves only the sweep's own objects to walk.
    gc.collect()
    gc.freeze()
    try:
        _sweep_points(spec, strategies, depths, batch_sizes, device, repeats, bar, rows, top)
    finally:
        gc.unfreeze()
    if bar is not None:
        bar.close()
    _add_ratios(rows)
    return rows


def _profile_point(step, inputs, model, device, repeats, k):
    """The step's peak, memory by category and largest tensors, from the same profiled step.

    The step runs once to trace, then ``repeats`` times under TensorFlow's profiler
    (`memory_by_category`); the step with the highest peak gives every memory figure of the
    point, so the table, the categories and ``--top`` describe one and the same step.

    Returns:
      ``(MemoryCategories, seconds of the first profiled step)``.
    """
    import time

    from memgrad.profiler import memory_by_category

    worst, first_s = None, None
    for repeat in range(repeats):
        start = time.perf_counter()
        split = memory_by_category(step, inputs, weights=model.weights, k=k, device=device,
                                   warmup=1 if repeat == 0 else 0)
        first_s = first_s or (time.perf_counter() - start) / (2 if repeat == 0 else 1)
        if worst is None or split.peak_bytes - split.baseline_bytes > worst.peak_bytes - worst.baseline_bytes:
            worst = split
    return worst, first_s


def _sweep_points(spec, strategies, depths, batch_sizes, device, repeats, bar, rows, top):
    import tensorflow as tf

    from memgrad.profiler import oom_report
    from memgrad.cli import sweep

    for depth in depths:
        for batch_size in batch_sizes:
            fast = []  # rows of steps under FAST_STEP_S: timed side by side once all are profiled
            for strategy in strategies:
                if bar is not None:
                    bar.set_postfix_str(f"{strategy}, {point(depth, batch_size, spec.source)}")
                # Each workload is profiled alone: another one alive would change the allocator's
                # layout (and so the peak: BFC rounds a buffer up to its chunk) and fill the device.
                step, inputs, model = sweep.workload(spec, strategy, depth, batch_size)
                row = {"model": spec.source, "strategy": strategy, "depth": depth, "batch_size": batch_size,
                       "peak_bytes": None, "peak_above_baseline_bytes": None, "ms_per_step": None,
                       "time_spread": None, "out_of_memory": False, "categories": None, "oom_report": None,
                       "half_precision": sweep.computes_in_half_precision(model)}
                listed = top is not None and (depth, batch_size) == tuple(top[:2])
                k = top[2] if listed else 1
                try:
                    split, first_s = _profile_point(step, inputs, model, device, repeats, k)
                except tf.errors.ResourceExhaustedError:
                    row["out_of_memory"] = True
                    found = oom_report(step, inputs, weights=model.weights, k=5, device=device)
                    row["oom_report"] = None if found is None else found.as_dict()
                else:
                    row.update(peak_bytes=split.peak_bytes,
                               peak_above_baseline_bytes=split.peak_bytes - split.baseline_bytes,
                               categories={name: split.as_dict()[name] for name in CATEGORIES})
                    if listed:
                        row["top"] = {"peak_above_baseline_bytes": split.peak_bytes - split.baseline_bytes,
                                      "tensors": [t.as_dict() for t in split.tensors]}
                    if first_s < FAST_STEP_S:
                        fast.append((row, first_s))
                    else:  # a slow step's time varies little: timed alone, now
                        ((seconds, spread, _),) = time_steps([(step, inputs, first_s)])
                        row.update(ms_per_step=seconds * 1e3, time_spread=spread)
                rows.append(row)
                del step, inputs, model
                sweep.release()
                if bar is not None:
                    bar.update()
            time_side_by_side(spec, depth, batch_size, fast)


def _add_ratios(rows):
    """Each row's memory and time relative to plain backprop at the same point.

    The time overhead is the median over the timed rounds of the row's mean over plain's in the
    same round (the steps were timed side by side), or the ratio of medians without rounds.
    """
    import statistics

    plain = {(r["depth"], r["batch_size"]): r for r in rows if r["strategy"] == "plain"}
    for row in rows:
        base = plain.get((row["depth"], row["batch_size"]))
        usable = base is not None and not base["out_of_memory"] and not row["out_of_memory"]
        row["memory_ratio"] = (row["peak_above_baseline_bytes"] / base["peak_above_baseline_bytes"]
                               if usable and base["peak_above_baseline_bytes"] else None)
        rounds, base_rounds = row.get("_round_means"), base.get("_round_means") if base else None
        together = base is not None and row.get("_timed_with") is not None and row.get("_timed_with") is base.get("_timed_with")
        if usable and together and rounds and base_rounds and len(rounds) == len(base_rounds):
            row["time_overhead"] = statistics.median(a / b for a, b in zip(rounds, base_rounds))
        else:
            row["time_overhead"] = row["ms_per_step"] / base["ms_per_step"] if usable else None
    for row in rows:
        row.pop("_round_means", None)
        row.pop("_timed_with", None)


def main(argv=None) -> int:
    """Runs the command; returns its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    _rerun_with_exact_cpu_stats(argv)
    _quiet_tensorflow()
    if _onednn_under_a_cap():  # the user asked for oneDNN under a cap
        print(f"memgrad-profile: warning: {ONEDNN_VARIABLE}={os.environ.get(ONEDNN_VARIABLE)} under "
              f"{CAP_VARIABLE}: a step that runs out of memory in a oneDNN kernel crashes the process "
              f"instead of being reported; set {ONEDNN_VARIABLE}=0 to have out-of-memory points reported",
              file=sys.stderr)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("memgrad-profile: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # one clear line, never a traceback
        from memgrad.profiler import CappedRunError, MemoryStatsUnavailableError
        from memgrad.cli.sweep import ProfileError

        expected = (ProfileError, ValueError, CappedRunError, MemoryStatsUnavailableError, OSError)
        message = one_line(error)
        if not isinstance(error, expected):
            message = f"{type(error).__name__}: {message}"
        print(f"memgrad-profile: error: {message}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import keras
    import tensorflow as tf

    import memgrad
    from memgrad.profiler import resolve_device
    from memgrad.cli import sweep

    try:  # one op at a time: a step's peak is then the same from one run to the next
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow already started (main called inside a running program)
        pass
    spec = sweep.model_spec(args.model, width=args.width)
    if args.strategies:
        strategies = sweep.check_strategies(spec, args.strategies)
    elif spec.source == "coupling":
        strategies = HEADLINE_STRATEGIES
    else:  # selective layers change nothing in the command's tf.function steps: only when asked
        strategies = tuple(s for s in spec.strategies if s != "selective")
    if "plain" in strategies:  # measured first: the others are compared with it
        strategies = ("plain",) + tuple(s for s in strategies if s != "plain")
    if spec.kind == "file":
        if args.depths:
            raise sweep.ProfileError(f"a model file has a fixed depth; drop --depths for {spec.source!r}")
        depths = [None]
    else:
        depths = list(args.depths or spec.default_depths or [None])
    batch_sizes = list(args.batch_sizes or [spec.default_batch])
    device = resolve_device(args.device)

    deepest = max((d for d in depths if d is not None), default=None)
    top = (deepest, batch_sizes[0], args.top) if args.top else None
    unit = MB if args.budget and args.budget.decimal else MIB
    rows = run_sweep(spec, strategies, depths, batch_sizes, device, args.repeats, not args.no_progress, top)
    title = (f"memgrad-profile: {spec.source}" + (f" width {spec.width}" if spec.source == "coupling" else "")
             + f", on {device}")
    print(title)
    print(format_table(rows, unit))
    if "selective" in strategies:
        print(SELECTIVE_NOTE)
    kernels, kernel_warning = half_precision_kernels(rows)
    if kernel_warning:
        print(f"warning: {kernel_warning}")
    if profiled_at(rows, deepest, batch_sizes[0]):
        print()
        print(format_categories(rows, deepest, batch_sizes[0], unit))
    for row in rows:
        if row["oom_report"] is not None:
            print()
            print(format_oom(row, rows, unit))
    result = {
        "command": "memgrad-profile", "model": spec.source, "device": device, "strategies": list(strategies),
        "depths": depths, "batch_sizes": batch_sizes, "width": spec.width if spec.source == "coupling" else None,
        "repeats": args.repeats, "peak": PEAK_BASIS + " (peak_above_baseline_bytes; peak_bytes counts them too)",
        "versions": {"memgrad": memgrad.__version__, "tensorflow": tf.__version__, "keras": keras.__version__,
                     "python": platform.python_version()},
        "rows": [{k: v for k, v in row.items() if k != "top"} for row in rows], "budget": None, "top": None,
        "half_precision_kernels": kernels,
    }
    if args.budget:
        result["budget"] = find_budget_batches(spec, strategies, deepest, rows, args.budget.bytes,
                                               progress=not args.no_progress, label=args.budget.text)
        print()
        print(format_budget(result["budget"], args.budget.text, unit, spec.source))
    if args.top:
        result["top"] = {r["strategy"]: dict(r["top"], depth=deepest, batch_size=batch_sizes[0])
                         for r in rows if "top" in r}
        for strategy, found in result["top"].items():
            print()
            print(format_top(strategy, found, spec.source, unit))
    result["drift"] = None
    reversible_fits = any(r["strategy"] == "reversible" and r["depth"] == deepest and r["batch_size"] == batch_sizes[0]
                          and not r["out_of_memory"] for r in rows)
    if "reversible" in strategies and not reversible_fits:
        print()
        print(f"reversible drift: not measured (the step at {point(deepest, batch_sizes[0], spec.source)} "
              "ran out of memory)")
    elif "reversible" in strategies:
        from memgrad.cli.drift import format_drift, measure_drift

        print()
        try:
            result["drift"] = measure_drift(spec, deepest, batch_sizes[0])
        except tf.errors.ResourceExhaustedError:  # the check keeps every block's input: more memory
            print(f"reversible drift: not measured (the check ran out of memory at "
                  f"{point(deepest, batch_sizes[0], spec.source)})")
        else:
            print(format_drift(result["drift"], point(deepest, batch_sizes[0], spec.source)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2)
        print(f"wrote {args.json}")
    if args.plot:
        try:
            plot(rows, args.plot, title, unit)
            print(f"wrote {args.plot}")
        except ImportError as error:
            print(f"no plot: {error.name or 'matplotlib'} is not installed "
                  "(pip install 'memgrad[cli]'); the table and JSON are complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
