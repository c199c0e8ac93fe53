"""What memgrad-profile shows: the results table, the plot, budget lines and one-line errors."""

from __future__ import annotations

import re

from memgrad.profiler import format_bytes


# What each column of the table means, printed once under it.
TABLE_LEGEND = (
    "peak MiB: the training step's peak memory above the model's weights and inputs\n"
    "vs plain: that peak over plain backprop's at the same depth and batch\n"
    "ms/step: time of one training step, the median of the timed rounds\n"
    "spread: how far the timed rounds differ (slowest minus fastest, over the median)\n"
    "time vs plain: time per step over plain backprop's, timed side by side")
# Above this spread a time is noise more than a result: the table says so.
NOISY_SPREAD = 0.10


def _noisy(row) -> bool:
    """Whether a row's timed rounds differ by more than `NOISY_SPREAD`."""
    return (row.get("time_spread") or 0.0) > NOISY_SPREAD


def format_table(rows) -> str:
    """Renders sweep rows as a fixed-width text table, with what each column means and a note
    when the timed rounds of a point differ by more than 10%."""
    header = (f"{'depth':>6} {'batch':>6} {'strategy':<11} {'peak MiB':>10} {'vs plain':>9} "
              f"{'ms/step':>9} {'spread':>7} {'time vs plain':>14}")
    lines = [header, "-" * len(header)]
    noisy = []
    for row in rows:
        depth = "-" if row["depth"] is None else str(row["depth"])
        if row["out_of_memory"]:
            lines.append(f"{depth:>6} {row['batch_size']:>6} {row['strategy']:<11} {'out of memory':>10}")
            continue
        ratio = "" if row["memory_ratio"] is None else f"{row['memory_ratio']:.2f}x"
        overhead = "" if row["time_overhead"] is None else f"{row['time_overhead']:.2f}x"
        spread = row.get("time_spread")
        shown = "" if spread is None else f"{spread:.0%}"
        if _noisy(row):
            noisy.append(row)
            shown += "*"
        lines.append(
            f"{depth:>6} {row['batch_size']:>6} {row['strategy']:<11} "
            f"{row['peak_above_baseline_bytes'] / 2**20:>10.2f} {ratio:>9} {row['ms_per_step']:>9.1f} "
            f"{shown:>7} {overhead:>14}"
        )
    lines += ["", TABLE_LEGEND]
    if noisy:
        worst = max(r["time_spread"] for r in noisy)
        lines.append(f"* timed rounds differ by more than {NOISY_SPREAD:.0%} ({len(noisy)} of "
                     f"{len(rows)} rows, up to {worst:.0%}): the machine was busy, so read those "
                     "times as rough; memory is not affected. Rerun on an idle machine to compare times.")
    return "\n".join(lines)


_CATEGORY_LABELS = {"weights": "weights", "optimizer": "optimizer state", "inputs_and_other": "inputs, other",
                    "activations": "activations", "gradients": "weight gradients", "temporaries": "temporaries"}


def format_categories(rows, depth, batch_size) -> str:
    """The memory-by-category lines of each strategy at one point (MiB at the step's peak)."""
    from memgrad.profiler import CATEGORIES

    chosen = [r for r in rows if r["depth"] == depth and r["batch_size"] == batch_size and r["categories"]]
    where = f"depth {'-' if depth is None else depth}, batch {batch_size}"
    header = f"{'memory at the peak, MiB':<24}" + "".join(f"{r['strategy']:>12}" for r in chosen)
    lines = [f"what the peak holds ({where}):", header]
    for name in CATEGORIES:
        lines.append(f"  {_CATEGORY_LABELS[name]:<22}" + "".join(
            f"{r['categories'][name] / 2**20:>12.2f}" for r in chosen))
    lines.append(f"  {'sum (peak incl. weights)':<22}" + "".join(
        f"{sum(r['categories'].values()) / 2**20:>12.2f}" for r in chosen))
    return "\n".join(lines)


def _tensor_lines(tensors) -> list:
    """The profiler's lines for tensors in their JSON form (`LiveTensor.as_dict`)."""
    from memgrad.profiler import LiveTensor

    return [str(LiveTensor(**t)) for t in tensors]


def format_top(strategy, found) -> str:
    """The largest tensors alive at one strategy's peak (a row's ``top``)."""
    depth = "-" if found["depth"] is None else found["depth"]
    lines = [f"{strategy} (depth {depth}, batch {found['batch_size']}): peak "
             f"{format_bytes(found['peak_above_baseline_bytes'])} above the weights and inputs; "
             "largest tensors alive at the peak:"]
    return "\n".join(lines + _tensor_lines(found["tensors"]))


def format_oom(row, rows) -> str:
    """What was alive when a sweep point ran out of memory, and what each strategy needed there."""
    report = row["oom_report"]
    depth = "-" if row["depth"] is None else row["depth"]
    lines = [f"{row['strategy']} at depth {depth}, batch {row['batch_size']} ran out of memory on "
             f"{report['device']}: {report['message']}",
             "largest tensors alive when it failed:"] + _tensor_lines(report["memory"]["tensors"])
    others = [r for r in rows if r["depth"] == row["depth"] and r["batch_size"] == row["batch_size"]
              and r is not row]
    if others:
        needs = ", ".join(f"{r['strategy']} " + ("out of memory too" if r["out_of_memory"] else
                                                 format_bytes(r["peak_bytes"])) for r in others)
        lines.append(f"what the other strategies needed here (peak incl. weights): {needs}")
    return "\n".join(lines)


def plot(rows, path, title) -> None:
    """Draws peak memory and time overhead per strategy against depth (or batch size) to ``path``."""
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
    _plot_categories(stacked, rows, plt)
    for index, strategy in enumerate(strategies):
        points = [r for r in rows if r["strategy"] == strategy and not r["out_of_memory"]
                  and (fixed is None or r[fixed[0]] == fixed[1])]
        if axis is None:
            if points:
                left.bar(index, points[0]["peak_above_baseline_bytes"] / 2**20, label=strategy)
                if points[0]["time_overhead"] is not None:
                    right.bar(index, points[0]["time_overhead"], yerr=_half_spread(points[0]),
                              capsize=3, label=strategy)
            continue
        points.sort(key=lambda r: r[axis])
        xs = [r[axis] for r in points]
        left.plot(xs, [r["peak_above_baseline_bytes"] / 2**20 for r in points], "o-", label=strategy)
        timed = [r for r in points if r["time_overhead"] is not None]
        right.errorbar([r[axis] for r in timed], [r["time_overhead"] for r in timed],
                       yerr=[_half_spread(r) for r in timed], fmt="o-", capsize=3, label=strategy)
    left.set_title("peak memory of a training step (above weights)")
    left.set_ylabel("MiB")
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
        else:
            ax.set_xlabel(label + (f" ({fixed[0].replace('_', ' ')} {fixed[1]})" if fixed[1] is not None else ""))
        ax.legend()
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _half_spread(row) -> float:
    """Half the spread of a row's timed rounds, in units of its time overhead."""
    return 0.5 * (row.get("time_spread") or 0.0) * row["time_overhead"]


def _plot_categories(ax, rows, plt) -> None:
    """Stacked bars: each strategy's peak by category at the deepest depth, first batch size."""
    from memgrad.profiler import CATEGORIES

    depths = [r["depth"] for r in rows if r["depth"] is not None]
    depth = max(depths) if depths else None
    batch = min(r["batch_size"] for r in rows)
    chosen = [r for r in rows if r["depth"] == depth and r["batch_size"] == batch and r["categories"]]
    colors = plt.get_cmap("tab10").colors
    bottoms = [0.0] * len(chosen)
    for index, name in enumerate(CATEGORIES):
        heights = [r["categories"][name] / 2**20 for r in chosen]
        ax.bar(range(len(chosen)), heights, bottom=bottoms, color=colors[index], label=_CATEGORY_LABELS[name])
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(chosen)), [r["strategy"] for r in chosen])
    ax.set_ylabel("MiB")
    ax.set_title(f"what the peak holds (depth {'-' if depth is None else depth}, batch {batch})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")


def format_budget(results, label) -> str:
    """Renders `find_budget_batches` results; ``label`` names the budget (e.g. ``'512MB'``)."""

    depth = results[0]["depth"]
    lines = [f"Largest batch that ran under {label} (a CPU allocator capped at "
             f"{format_bytes(results[0]['budget_bytes'])}), depth {'-' if depth is None else depth}:"]
    for r in results:
        larger = "" if r["vs_plain"] is None or r["strategy"] == "plain" else f"  fits {r['vs_plain']:.1f}x the batch of plain"
        failing = "" if r["first_failing"] is None else f" ({r['first_failing']} did not)"
        predicted = r.get("predicted_batch_size")
        guess = "" if predicted is None else f", predicted {predicted} without a run"
        lines.append(f"  {r['strategy']:<11} batch {r['batch_size']}{failing}{guess}{larger}")
    return "\n".join(lines)


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
