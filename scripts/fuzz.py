"""The long randomized-graph run: memgrad's gradients against TensorFlow's on N random graphs.

Each graph i is drawn from `random.Random(f"{seed}:{i}")` (tests/checkpointing/
random_graphs.py), so any failure is reproduced by `--seed S --only i`. Every strategy
('memory', 'speed', a list, a Budget, memgrad.GradientTape) is compared with tf.gradients /
tf.GradientTape of the same forward in the same tf.function.

Usage:
    python scripts/fuzz.py --graphs 1000 [--seed 0] [--jobs 2] [--start 0] [--only 17] [--loops]
                           [--dtypes] [--higher] [--timeout 900]

With --loops every graph holds at least one loop (tf.scan, tf.foldl, tf.map_fn, a
tf.while_loop writing a TensorArray or running a data-dependent number of steps, a Keras
recurrent layer, a scan inside a nested tf.function or a tf.cond, nested loops). With
--dtypes each graph computes in a drawn dtype: float32, float64, or a mixed-precision policy
(float16 or bfloat16 ops on float32 variables), judged within that dtype's tolerance. With
--higher each graph takes a gradient inside a tf.cond branch or a while loop's body (with
respect to a tensor of its own or of the enclosing graph; its result checked against
tf.gradients there), or has every strategy's gradient differentiated again by the same
strategy (against tf.gradients of tf.gradients), or both.

Prints progress, then the distribution of the max relative error (per strategy and per
graph), counts of crashes / wrong gradients / hangs / fallbacks / budget errors, and the repro
(seed, index, graph description, error) of every failure. A graph with no result within
--timeout seconds is a `hang`: its worker process is stopped and the run goes on. Exits 1 if
anything failed.
"""

import argparse
import collections
import concurrent.futures
import multiprocessing
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402  (after the path and environment above)

from tests.checkpointing.random_graphs import (  # noqa: E402
    DTYPES, FAILURES, HIGHER_KINDS, TOLERANCE, TOLERANCES, GraphResult, Outcome, RandomChooser, check_graph,
    draw_spec,
)


def graph_seed(seed, index):
    """The RandomChooser seed of graph `index` of a run."""
    return f"{seed}:{index}"


def _flags(loops, dtypes, higher=False):
    """The command-line flags that draw the same graphs."""
    return ((" --loops" if loops else "") + (" --dtypes" if dtypes else "")
            + (" --higher" if higher else ""))


def summarize(results, seed, elapsed, loops=False, dtypes=False, higher=False):
    """The summary text of a list of `(index, GraphResult)`."""
    kinds_drawn = " and ".join(k for k, on in (("loops", loops), ("drawn dtypes", dtypes),
                                               ("higher-order gradients", higher)) if on)
    tolerance = (", ".join(f"{d} {TOLERANCES[d]:g}" for d in DTYPES) if dtypes
                 else f"{TOLERANCE:g}")
    lines = [f"== {len(results)} graphs{' with ' + kinds_drawn if kinds_drawn else ''}, "
             f"seed {seed}, {elapsed:.0f} s "
             f"({elapsed / max(len(results), 1):.2f} s/graph), tolerance {tolerance}"]
    if dtypes:
        drawn = collections.Counter(r.spec.dtype for _, r in results)
        lines.append("dtypes: " + "  ".join(f"{d}={drawn[d]}" for d in DTYPES))
    if higher:
        inner = collections.Counter(r.spec.layers[-1] for _, r in results
                                    if r.spec.layers[-1][0] in HIGHER_KINDS)
        lines.append(f"second order: {sum(r.spec.second_order for _, r in results)} graphs; "
                     "gradients inside: " + "  ".join(f"{k}/{a}={n}" for (k, a), n in
                                                       sorted(inner.items())))
    errors = collections.defaultdict(list)
    statuses = collections.Counter()
    budget_errors = 0
    for _, result in results:
        for o in result.outcomes:
            statuses[(o.strategy, o.status)] += 1
            budget_errors += o.budget_error
            if np.isfinite(o.error) and o.status not in ("crash", "budget_error"):
                errors[o.strategy].append(o.error)
    quantiles = (0.5, 0.9, 0.99)
    lines.append("max relative error, per strategy:  " + "  ".join(
        f"q{int(q * 100)}" for q in quantiles) + "  max")
    every = []
    for strategy, values in errors.items():
        every.extend(values)
        qs = np.quantile(values, quantiles)
        lines.append(f"  {strategy:>8} (n={len(values):4d}): "
                     + "  ".join(f"{v:.2e}" for v in qs) + f"  {max(values):.2e}")
    if every:
        qs = np.quantile(every, quantiles)
        lines.append(f"  {'all':>8} (n={len(every):4d}): "
                     + "  ".join(f"{v:.2e}" for v in qs) + f"  {max(every):.2e}")
    strategies = sorted({s for s, _ in statuses})
    kinds = ("ok", "wrong", "crash", "hang", "fallback", "noise", "budget_plain", "budget_error",
             "cut_plain", "speed_plain")
    lines.append("outcomes: " + "  ".join(
        f"{kind}={sum(statuses[(s, kind)] for s in strategies)}" for kind in kinds)
        + f"  (BudgetError then retried at the smallest feasible budget: {budget_errors})")
    for s in strategies:
        lines.append(f"  {s:>8}: " + "  ".join(
            f"{kind}={statuses[(s, kind)]}" for kind in kinds if statuses[(s, kind)]))
    failed = [(i, r) for i, r in results if r.failures]
    lines.append(f"graphs with a failure: {len(failed)}")
    for i, result in failed:
        lines.append(f"-- FAILURE: repro with `python scripts/fuzz.py --seed {seed} --only {i}"
                     f"{_flags(loops, dtypes, higher)}`")
        lines.append(result.report())
    return "\n".join(lines)


def _check(args):
    """Draws and checks graph `index` of run `seed` (in a worker process with --jobs)."""
    seed, index, loops, dtypes, higher = args
    warnings.simplefilter("ignore")  # 'memory' warns when it keeps nothing; counted below
    return index, check_graph(draw_spec(RandomChooser(graph_seed(seed, index)), loops=loops,
                                        dtypes=dtypes, higher=higher))


def _hung(work, timeout):
    """The result of a graph that gave none within ``timeout`` seconds (its worker is stopped)."""
    seed, index, loops, dtypes, higher = work
    spec = draw_spec(RandomChooser(graph_seed(seed, index)), loops=loops, dtypes=dtypes, higher=higher)
    return index, GraphResult(spec, [Outcome("graph", "hang", detail=(
        f"no result in {timeout:g} s: tracing or running the step never finished (its worker "
        "process was stopped)"))])


def _results(seed, indices, jobs, loops=False, dtypes=False, higher=False, timeout=None):
    """Yields `(index, GraphResult)` in order, from `jobs` processes when more than one, or
    whenever there is a `timeout`: a graph with no result within it is reported as `hang`
    and its pool of workers replaced, so one stuck graph cannot stop the run."""
    work = [(seed, i, loops, dtypes, higher) for i in indices]
    if jobs <= 1 and not timeout:
        yield from map(_check, work)
        return
    context = multiprocessing.get_context("spawn")  # TensorFlow does not survive fork
    while work:
        pool = concurrent.futures.ProcessPoolExecutor(max(jobs, 1), mp_context=context)
        futures = [pool.submit(_check, w) for w in work]
        for position, future in enumerate(futures):
            try:
                yield future.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                yield _hung(work[position], timeout)
                done = [f.result() for f in futures[position + 1:] if f.done() and not f.exception()]
                finished = {index for index, _ in done}
                yield from sorted(done, key=lambda r: r[0])
                work = [w for w in work[position + 1:] if w[1] not in finished]
                for process in list(getattr(pool, "_processes", {}).values()):
                    process.terminate()
                pool.shutdown(wait=False, cancel_futures=True)
                break
        else:
            pool.shutdown()
            work = []


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=100, help="how many graphs")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed")
    parser.add_argument("--start", type=int, default=0,
                        help="the first graph's index (split a sweep over machines or "
                             "processes: --start 150 --graphs 150 is the second half of 300)")
    parser.add_argument("--only", type=int, default=None, help="check graph i alone")
    parser.add_argument("--every", type=int, default=100,
                        help="print the running summary every this many graphs")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds a graph may take before it is reported as a hang and its "
                             "worker stopped (default: 900; 0: no limit, and with --jobs 1 no "
                             "worker process)")
    parser.add_argument("--loops", action="store_true",
                        help="draw at least one loop into every graph")
    parser.add_argument("--dtypes", action="store_true",
                        help="draw each graph's dtype: float32, float64, mixed float16/bfloat16")
    parser.add_argument("--higher", action="store_true",
                        help="draw gradients inside branches and loop bodies, and gradients "
                             "of gradients")
    args = parser.parse_args(argv)
    indices = [args.only] if args.only is not None else range(args.start, args.start + args.graphs)
    results, start = [], time.perf_counter()
    drawn = dict(loops=args.loops, dtypes=args.dtypes, higher=args.higher)
    runs = _results(args.seed, indices, args.jobs, timeout=args.timeout or None, **drawn)
    for n, (i, result) in enumerate(runs, 1):
        spec = result.spec
        results.append((i, result))
        worst = max((o.error for o in result.outcomes if o.status in FAILURES or
                     o.status == "ok"), default=0.0)
        flag = " FAILED: " + ",".join(f"{o.strategy}={o.status}" for o in result.failures) \
            if result.failures else ""
        print(f"[{n}/{len(indices)}] graph {i}: {len(spec.conv)} conv + "
              f"{len(spec.layers)} layers, {spec.dtype}, max error {worst:.2e}{flag}",
              flush=True)
        if args.only is not None:
            print(result.report())
        if n % args.every == 0 and n < len(indices):
            print(summarize(results, args.seed, time.perf_counter() - start, **drawn),
                  flush=True)
    print(summarize(results, args.seed, time.perf_counter() - start, **drawn), flush=True)
    return 1 if any(r.failures for _, r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
