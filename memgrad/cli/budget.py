"""`memgrad-profile --budget`: the largest batch each strategy fits in a memory budget, found
by capped runs and predicted from traces."""

from __future__ import annotations

from memgrad.cli.report import one_line


def find_budget_batches(spec, strategies, depth, rows, budget, progress=False, label=None):
    """The largest batch per strategy that fits ``budget`` bytes on the emulated device.

    The search starts from a guess extrapolated from the sweep's measured peak at the same
    depth, then every answer is a batch that actually ran under the cap (`max_batch_size`).
    Next to it, the batch `predict_max_batch_size` predicts from traced steps alone, with no
    run (``None`` where the prediction failed). With ``progress``, each step of the search is
    a line on stderr naming the budget as ``label`` (as the user gave it; default: in MiB).

    Returns:
      A list of dicts: ``strategy``, ``depth``, ``budget_bytes``, ``batch_size`` (largest that
      ran), ``first_failing`` (smallest that did not, or ``None``), ``probes``, ``vs_plain``,
      ``predicted_batch_size``, ``prediction_error`` (why it is ``None``, else ``None``).
    """
    import concurrent.futures
    import sys
    import threading

    from memgrad.profiler import format_bytes, max_batch_size

    lock = threading.Lock()

    def say(text):
        if progress:
            with lock:
                print(f"budget {label or format_bytes(budget)}: {text}", file=sys.stderr, flush=True)

    predictions = {}
    for strategy in strategies:
        say(f"{strategy}: predicting the largest batch from traced steps")
        predictions[strategy] = predict_budget_batch(spec, strategy, depth, budget)

    def search_one(strategy):
        measured = [r for r in rows if r["strategy"] == strategy and r["depth"] == depth
                    and not r["out_of_memory"]]
        guess = None
        if measured:
            row = max(measured, key=lambda r: r["batch_size"])
            guess = max(1, min(1 << 16, int(row["batch_size"] * budget / max(row["peak_bytes"], 1))))
        kwargs = {"source": spec.source, "strategy": strategy, "depth": depth, "width": spec.width}
        say(f"{strategy}: searching, each batch one capped run" + (f" (first guess {guess})" if guess else ""))
        search = max_batch_size("memgrad.cli.sweep:capped_step", budget, kwargs,
                                high=1 << 16, start=guess, rtol=0.05,
                                on_probe=lambda run: say(f"{strategy}, batch {run.kwargs['batch_size']}: "
                                                         + ("fits" if run.fits else "out of memory")))
        failing = [p.kwargs["batch_size"] for p in search.probes if not p.fits]
        return {"strategy": strategy, "depth": depth, "budget_bytes": search.limit_bytes,
                "batch_size": search.batch_size, "first_failing": min(failing) if failing else None,
                "probes": len(search.probes)}

    # Each probe is a subprocess that mostly imports TensorFlow or waits out an allocation
    # failure: two strategies' searches at a time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(search_one, strategies))
    plain = next((r["batch_size"] for r in results if r["strategy"] == "plain"), None)
    for result in results:
        result["vs_plain"] = result["batch_size"] / plain if plain else None
        result["predicted_batch_size"], result["prediction_error"] = predictions[result["strategy"]]
    return results


def predict_budget_batch(spec, strategy, depth, budget):
    """``(largest batch predicted to fit budget bytes, None)`` from traced steps of one model
    (`predict_max_batch_size`), or ``(None, reason)`` if the prediction failed."""
    import tensorflow as tf

    from memgrad.profiler import predict_max_batch_size
    from memgrad.cli.sweep import build_model, input_batch, training_step

    try:
        model = build_model(spec, strategy, depth)
        step = training_step(model, strategy)
        one = input_batch(model, 1, spec)

        def build(batch_size):
            return step, tuple(tf.TensorSpec([batch_size, *t.shape[1:]], t.dtype) for t in one)

        return predict_max_batch_size(build, budget, high=1 << 16).batch_size, None
    except Exception as error:  # noqa: BLE001 - a prediction must never stop the measured search
        return None, one_line(error)
