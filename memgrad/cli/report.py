"""What memgrad-profile shows: the results table, the plot, budget lines and one-line errors."""

from __future__ import annotations

import collections
import os
import re


class Unit(collections.namedtuple("Unit", "name bytes")):
    """The unit every memory figure of one run is shown in."""

    def format(self, num_bytes, digits=2) -> str:
        return f"{num_bytes / self.bytes:.{digits}f} {self.name}"


MIB = Unit("MiB", 2**20)
MB = Unit("MB", 10**6)  # when the user gave a size in decimal units (--budget 512MB)

# "The peak" everywhere (table, plot, JSON): what one training step allocates above what is
# held before it runs, the weights (and optimizer state) and the batch of inputs.
PEAK_BASIS = "peak: what one training step allocates above the weights and inputs held before it"


def table_legend(unit=MIB) -> str:
    """What each column of the table means, printed once under it."""
    return (
        f"peak {unit.name}: the training step's peak memory above the model's weights and inputs\n"
        "vs plain: that peak over plain backprop's at the same point\n"
        "ms/step: time of one training step, the median of the timed rounds\n"
        "spread: how far the timed rounds differ (slowest minus fastest, over the median)\n"
        "time vs plain: time per step over plain backprop's, timed side by side")


def model_name(source) -> str:
    """How a model is named in the output: a file by its name, a builder or zoo model as given."""
    return os.path.basename(source) if str(source).endswith(".keras") else str(source)


def point(depth, batch_size, source=None) -> str:
    """A sweep point in words: ``depth 16, batch 256``, or ``model.keras, batch 8`` for a model
    without a depth."""
    if depth is None:
        return f"{model_name(source)}, batch {batch_size}" if source is not None else f"batch {batch_size}"
    return f"depth {depth}, batch {batch_size}"


# Above this spread a time is noise more than a result: the table says so.
NOISY_SPREAD = 0.10


def _noisy(row) -> bool:
    """Whether a row's timed rounds differ by more than `NOISY_SPREAD`."""
    return (row.get("time_spread") or 0.0) > NOISY_SPREAD


def format_table(rows, unit=MIB) -> str:
    """Renders sweep rows as a fixed-width text table, with what each column means and a note
    when the timed rounds of a point differ by more than 10%. A model without a depth (a
    ``.keras`` file) is named in the first column instead."""
    by_name = all(row["depth"] is None for row in rows)
    first = max([len("model")] + [len(model_name(r["model"])) for r in rows]) if by_name else 6
    header = (f"{'model' if by_name else 'depth':>{first}} {'batch':>6} {'strategy':<11} "
              f"{'peak ' + unit.name:>10} {'vs plain':>9} {'ms/step':>9} {'spread':>7} {'time vs plain':>14}")
    lines = [header, "-" * len(header)]
    noisy = []
    for row in rows:
        depth = model_name(row["model"]) if by_name else "-" if row["depth"] is None else str(row["depth"])
        if row["out_of_memory"]:
            lines.append(f"{depth:>{first}} {row['batch_size']:>6} {row['strategy']:<11} {'out of memory':>10}")
            continue
        ratio = "" if row["memory_ratio"] is None else f"{row['memory_ratio']:.2f}x"
        overhead = "" if row["time_overhead"] is None else f"{row['time_overhead']:.2f}x"
        spread = row.get("time_spread")
        shown = "" if spread is None else f"{spread:.0%}"
        if _noisy(row):
            noisy.append(row)
            shown += "*"
        lines.append(
            f"{depth:>{first}} {row['batch_size']:>6} {row['strategy']:<11} "
            f"{row['peak_above_baseline_bytes'] / unit.bytes:>10.2f} {ratio:>9} {row['ms_per_step']:>9.1f} "
            f"{shown:>7} {overhead:>14}"
        )
    lines += ["", table_legend(unit)]
    if noisy:
        worst = max(r["time_spread"] for r in noisy)
        lines.append(f"* timed rounds differ by more than {NOISY_SPREAD:.0%} ({len(noisy)} of "
                     f"{len(rows)} rows, up to {worst:.0%}): the machine was busy, so read those "
                     "times as rough; memory is not affected. Rerun on an idle machine to compare times.")
    return "\n".join(lines)


# What a step allocates above what is held before it, in the order the table and plot show it.
STEP_PARTS = ("activations", "weight gradients", "temporaries", "other")


def profiled_at(rows, depth, batch_size) -> list:
    """The rows of one sweep point whose step was profiled (that have categories)."""
    return [r for r in rows if r["depth"] == depth and r["batch_size"] == batch_size and r["categories"]]


def step_parts(row) -> dict:
    """What a row's peak holds, on the peak's own basis: {part: bytes} above the weights and
    inputs held before the step, summing to ``peak_above_baseline_bytes`` (its ``other`` is
    the rest: the loss, copies of inputs, small buffers), plus ``held_before``: the bytes of
    the weights, optimizer state and inputs, which the peak does not count."""
    categories, peak = row["categories"], row["peak_above_baseline_bytes"]
    parts = {"activations": categories["activations"], "weight gradients": categories["gradients"],
             "temporaries": categories["temporaries"]}
    parts["other"] = max(0, peak - sum(parts.values()))
    parts["held_before"] = row["peak_bytes"] - peak
    return parts


def format_categories(rows, depth, batch_size, unit=MIB) -> str:
    """What each strategy's peak holds at one point, in ``unit``, above the weights and inputs
    (the table's basis), and what was held before the step."""
    chosen = profiled_at(rows, depth, batch_size)
    parts = [step_parts(r) for r in chosen]
    header = f"{'  ' + unit.name:<24}" + "".join(f"{r['strategy']:>12}" for r in chosen)
    lines = [f"what the peak holds ({point(depth, batch_size, chosen[0]['model'] if chosen else None)}), "
             "above the weights and inputs:", header]
    for name in STEP_PARTS:
        lines.append(f"  {name:<22}" + "".join(f"{p[name] / unit.bytes:>12.2f}" for p in parts))
    lines.append(f"  {'peak (as in the table)':<22}" + "".join(
        f"{r['peak_above_baseline_bytes'] / unit.bytes:>12.2f}" for r in chosen))
    before = max(p["held_before"] for p in parts)
    lines.append(f"held before the step and not counted: {unit.format(before)} (weights, optimizer state, "
                 "inputs)")
    return "\n".join(lines)


def _tensor_lines(tensors) -> list:
    """The profiler's lines for tensors in their JSON form (`LiveTensor.as_dict`)."""
    from memgrad.profiler import LiveTensor

    return [str(LiveTensor(**t)) for t in tensors]


def format_top(strategy, found, source=None, unit=MIB) -> str:
    """The largest tensors alive at one strategy's peak (a row's ``top``)."""
    lines = [f"{strategy} ({point(found['depth'], found['batch_size'], source)}): peak "
             f"{unit.format(found['peak_above_baseline_bytes'])} above the weights and inputs; "
             "largest tensors alive at the peak:"]
    return "\n".join(lines + _tensor_lines(found["tensors"]))


def format_oom(row, rows, unit=MIB) -> str:
    """What was alive when a sweep point ran out of memory, and what each strategy needed there."""
    report = row["oom_report"]
    lines = [f"{row['strategy']} at {point(row['depth'], row['batch_size'], row['model'])} ran out of memory on "
             f"{report['device']}: {report['message']}",
             "largest tensors alive when it failed:"] + _tensor_lines(report["memory"]["tensors"])
    others = [r for r in rows if r["depth"] == row["depth"] and r["batch_size"] == row["batch_size"]
              and r is not row]
    if others:
        needs = ", ".join(f"{r['strategy']} " + ("out of memory too" if r["out_of_memory"] else
                                                 unit.format(r["peak_above_baseline_bytes"])) for r in others)
        lines.append(f"what the other strategies needed here (peak above the weights and inputs): {needs}")
    return "\n".join(lines)


def plot(rows, path, title, unit=MIB) -> None:
    """Draws peak memory, time overhead and what the peak holds per strategy against depth (or
    batch size) to ``path``; every memory figure on the table's basis (`PEAK_BASIS`), in ``unit``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = sorted({r["depth"] for r in rows if r["depth"] is not None})
    batches = sorted({r["batch_size"] for r in rows})
    if len(depths) > 1:
        axis, label, fixed = "depth", "depth", ("batch_size", batches[0])
    elif len(batches) > 1:
        axis, label, fixed = "batch_size", "batch size", ("depth", rows[0]["depth"])
    else:
        axis, label, fixed = None, None, None
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    figure, (left, right, stacked) = plt.subplots(1, 3, figsize=(16, 4.4))
    _plot_categories(stacked, rows, plt, unit)
    for index, strategy in enumerate(strategies):
        points = [r for r in rows if r["strategy"] == strategy and not r["out_of_memory"]
                  and (fixed is None or r[fixed[0]] == fixed[1])]
        if axis is None:
            if points:
                left.bar(index, points[0]["peak_above_baseline_bytes"] / unit.bytes, label=strategy)
                if points[0]["time_overhead"] is not None:
                    right.bar(index, points[0]["time_overhead"], yerr=_half_spread(points[0]),
                              capsize=3, label=strategy)
            continue
        points.sort(key=lambda r: r[axis])
        xs = [r[axis] for r in points]
        left.plot(xs, [r["peak_above_baseline_bytes"] / unit.bytes for r in points], "o-", label=strategy)
        timed = [r for r in points if r["time_overhead"] is not None]
        right.errorbar([r[axis] for r in timed], [r["time_overhead"] for r in timed],
                       yerr=[_half_spread(r) for r in timed], fmt="o-", capsize=3, label=strategy)
    left.set_title("peak memory of a training step")
    left.set_ylabel(unit.name)
    right.set_title("time per step vs plain backprop (bars: spread of the timed rounds)")
    noisy = [r for r in rows if _noisy(r)]
    if noisy:
        right.text(0.01, 0.01, f"{len(noisy)} of {len(rows)} points: timed rounds differ by more "
                   f"than {NOISY_SPREAD:.0%}; the machine was busy", transform=right.transAxes,
                   fontsize=8, color="darkred")
    right.set_ylabel("x plain")
    right.axhline(1.0, color="gray", lw=0.8)
    for ax in (left, right):
        if axis is None:
            ax.set_xticks(range(len(strategies)), strategies)
            ax.set_xlabel(point(None, rows[0]["batch_size"], rows[0]["model"]))
        elif fixed[1] is None:  # a batch-size sweep of a model without a depth
            ax.set_xlabel(f"{label} ({model_name(rows[0]['model'])})")
        else:
            ax.set_xlabel(f"{label} ({fixed[0].replace('_', ' ')} {fixed[1]})")
        ax.legend()
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.text(0.5, 0.01, f"{PEAK_BASIS} ({unit.name}), in both memory panels and the table",
                ha="center", fontsize=9, color="dimgray")
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _half_spread(row) -> float:
    """Half the spread of a row's timed rounds, in units of its time overhead."""
    return 0.5 * (row.get("time_spread") or 0.0) * row["time_overhead"]


def _plot_categories(ax, rows, plt, unit) -> None:
    """Stacked bars: what each strategy's peak holds at the deepest depth and first batch size,
    above the weights and inputs (each bar as tall as that point in the left panel)."""
    depths = [r["depth"] for r in rows if r["depth"] is not None]
    depth = max(depths) if depths else None
    batch = min(r["batch_size"] for r in rows)
    chosen = profiled_at(rows, depth, batch)
    parts = [step_parts(r) for r in chosen]
    colors = plt.get_cmap("tab10").colors
    bottoms = [0.0] * len(chosen)
    for index, name in enumerate(STEP_PARTS):
        heights = [p[name] / unit.bytes for p in parts]
        ax.bar(range(len(chosen)), heights, bottom=bottoms, color=colors[index + 3], label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(chosen)), [r["strategy"] for r in chosen])
    ax.set_ylabel(unit.name)
    ax.set_title(f"what the peak holds ({point(depth, batch, chosen[0]['model'] if chosen else None)})")
    if parts:
        ax.set_xlabel(f"not counted: weights and inputs, {unit.format(max(p['held_before'] for p in parts))}")
        ax.set_ylim(top=1.3 * max(bottoms))  # room for the legend above the tallest bar
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3, axis="y")


def format_budget(results, label, unit=MIB, source=None) -> str:
    """Renders `find_budget_batches` results; ``label`` names the budget as the user gave it
    (e.g. ``'512MB'``), and the cap is shown in ``unit``."""
    depth = results[0]["depth"]
    where = f"depth {depth}" if depth is not None else model_name(source) if source else "the model"
    lines = [f"Largest batch that ran under {label} (a CPU allocator capped at "
             f"{unit.format(results[0]['budget_bytes'])}), {where}:"]
    for r in results:
        larger = "" if r["vs_plain"] is None or r["strategy"] == "plain" else f"  fits {r['vs_plain']:.1f}x the batch of plain"
        failing = "" if r["first_failing"] is None else f" ({r['first_failing']} did not)"
        predicted = r.get("predicted_batch_size")
        guess = "" if predicted is None else f", predicted {predicted} without a run"
        lines.append(f"  {r['strategy']:<11} batch {r['batch_size']}{failing}{guess}{larger}")
    return "\n".join(lines)


def half_precision_kernels(rows, check=None):
    """``(the kernel check as a dict, its warning)`` when a profiled model computes in half
    precision, else ``(None, None)``; the warning is ``None`` where every product is right.

    Args:
      rows: the sweep's rows (``half_precision``: whether the row's model computes in float16
        or bfloat16).
      check: a `memgrad.profiler.KernelCheck`; ``None`` runs the check on this machine.
    """
    if not any(row.get("half_precision") for row in rows):
        return None, None
    if check is None:
        from memgrad.profiler import check_half_precision_kernels

        check = check_half_precision_kernels()
    return check.as_dict(), check.warning()


def one_line(error) -> str:
    """An exception's message on one line.

    For an error raised inside a ``tf.function`` (``"in user code: ..."``), the error line
    at the end of the traceback; for a Keras layer error, the message Keras highlights.
    """
    text = str(error)
    highlighted = re.search(r"\x1b\[1m(.+?)\x1b\[0m", text, re.S)
    if highlighted:
        return " ".join(highlighted.group(1).split())
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("in user code"):
        errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
        return errors[-1] if errors else lines[-1]
    return lines[0]
