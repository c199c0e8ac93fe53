"""The drift section of `memgrad-profile`: how exactly a model's reversible stacks rebuild activations.

For a model with `memgrad.layers.ReversibleSequence` layers, one training step runs with a
`DriftMonitor` on every stack (stacks that already have one keep theirs: their first step
is always checked) and the per-block relative drift of the rebuilt activations is reported.
"""

from __future__ import annotations

import numpy as np


def reversible_stacks(model):
    """The `ReversibleSequence` layers inside ``model`` (nested ones included), in layer order."""
    from memgrad.layers import ReversibleSequence

    found, seen, pending = [], set(), [model]
    while pending:
        layer = pending.pop(0)
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if isinstance(layer, ReversibleSequence):
            found.append(layer)
            continue
        pending.extend(getattr(layer, "layers", []) or [])
        pending.extend(value for value in vars(layer).values() if hasattr(value, "trainable_variables")
                       and hasattr(value, "compute_dtype"))
    return found


def measure_drift(spec, depth, batch_size):
    """Runs one training step of the reversible model and reads every stack's drift monitor.

    Args:
      spec: a `memgrad.cli.sweep.ModelSpec`.
      depth: the depth (``None`` for a model without one).
      batch_size: the batch size.

    Returns:
      A list of dicts, one per stack: ``stack``, ``blocks``, ``invertible_dtype``,
      ``tolerance``, ``errors`` (per block, forward order), ``worst_block``, ``max_error``,
      ``nonfinite_blocks``; an empty list when the model has no reversible stack.

    Example:
      >>> from memgrad.cli.sweep import model_spec
      >>> rows = measure_drift(model_spec("coupling", width=64), 4, 8)
      >>> len(rows[0]["errors"])
      4
    """
    from memgrad.cli import sweep
    from memgrad.layers import DriftMonitor

    model = sweep.build_model(spec, "reversible", depth)
    stacks = [s for s in reversible_stacks(model) if not s.plain_backprop]
    if not stacks:
        return []
    for stack in stacks:
        if stack.drift_monitor is None:
            stack.drift_monitor = DriftMonitor(every=1)
            stack.drift_monitor.attach(stack.name, len(stack.blocks))
    step = sweep.training_step(model, "reversible")
    step(*sweep.input_batch(model, batch_size, spec))
    rows = []
    for stack in stacks:
        monitor = stack.drift_monitor
        errors = monitor.errors
        if errors is None:  # the stack did not take part in the step's gradient
            continue
        finite = np.where(np.isfinite(errors), errors, -np.inf)
        worst = int(np.argmax(finite))
        rows.append({
            "stack": stack.name, "blocks": len(stack.blocks), "invertible_dtype": stack.invertible_dtype,
            "tolerance": monitor.tolerance_for(stack.invertible_dtype),
            "errors": [float(e) for e in errors], "worst_block": worst, "max_error": float(errors[worst]),
            "nonfinite_blocks": [int(i) for i in np.flatnonzero(monitor.nonfinite)],
        })
    sweep.release()
    return rows


def format_drift(rows, where) -> str:
    """The drift section as text: one line per stack (named as in the model), at the sweep
    point ``where`` (e.g. ``'depth 16, batch 256'``)."""
    if not rows:
        return "reversible drift: the model has no reversible stack"
    lines = [f"reversible drift ({where}, one training step; relative error of each block's rebuilt input):"]
    width = max(len(r["stack"]) for r in rows)
    for row in rows:
        if row["nonfinite_blocks"]:
            found = "NaN/inf at blocks " + ", ".join(map(str, row["nonfinite_blocks"]))
        elif row["max_error"] == 0:
            found = "none: every block's input rebuilt exactly"
        else:
            verdict = "above" if row["max_error"] > row["tolerance"] else "within"
            found = (f"largest {row['max_error']:.1e} at block {row['worst_block']}, {verdict} the tolerance "
                     f"{row['tolerance']:g}" + (": ok" if verdict == "within" else ""))
        lines.append(f"  {row['stack']:<{width}}  {row['blocks']:>3} blocks in {row['invertible_dtype']:<8} {found}")
    return "\n".join(lines)
