"""What memgrad-profile shows: the results table, the plot, budget lines and one-line errors."""

from __future__ import annotations

import re

from memgrad._src.units import format_bytes


def format_table(rows) -> str:
    """Renders sweep rows as a fixed-width text table."""
    header = (f"{'depth':>6} {'batch':>6} {'strategy':<11} {'peak MiB':>10} {'vs plain':>9} "
              f"{'ms/step':>9} {'overhead':>9}")
    lines = [header, "-" * len(header)]
    for row in rows:
        depth = "-" if row["depth"] is None else str(row["depth"])
        if row["out_of_memory"]:
            lines.append(f"{depth:>6} {row['batch_size']:>6} {row['strategy']:<11} {'out of memory':>10}")
            continue
        ratio = "" if row["memory_ratio"] is None else f"{row['memory_ratio']:.2f}x"
        overhead = "" if row["time_overhead"] is None else f"{row['time_overhead']:.2f}x"
        lines.append(
            f"{depth:>6} {row['batch_size']:>6} {row['strategy']:<11} "
            f"{row['peak_above_baseline_bytes'] / 2**20:>10.2f} {ratio:>9} {row['ms_per_step']:>9.1f} "
            f"{overhead:>9}"
        )
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
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, strategy in enumerate(strategies):
        points = [r for r in rows if r["strategy"] == strategy and not r["out_of_memory"]
                  and (fixed is None or r[fixed[0]] == fixed[1])]
        if axis is None:
            if points:
                left.bar(index, points[0]["peak_above_baseline_bytes"] / 2**20, label=strategy)
                if points[0]["time_overhead"] is not None:
                    right.bar(index, points[0]["time_overhead"], label=strategy)
            continue
        points.sort(key=lambda r: r[axis])
        xs = [r[axis] for r in points]
        left.plot(xs, [r["peak_above_baseline_bytes"] / 2**20 for r in points], "o-", label=strategy)
        timed = [r for r in points if r["time_overhead"] is not None]
        right.plot([r[axis] for r in timed], [r["time_overhead"] for r in timed], "o-", label=strategy)
    left.set_title("peak memory of a training step (above weights)")
    left.set_ylabel("MiB")
    right.set_title("time per step vs plain backprop")
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


def format_budget(results, label) -> str:
    """Renders `find_budget_batches` results; ``label`` names the budget (e.g. ``'512MB'``)."""

    depth = results[0]["depth"]
    lines = [f"Largest batch that ran under {label} (a CPU allocator capped at "
             f"{format_bytes(results[0]['budget_bytes'])}), depth {'-' if depth is None else depth}:"]
    for r in results:
        larger = "" if r["vs_plain"] is None or r["strategy"] == "plain" else f"  fits {r['vs_plain']:.1f}x the batch of plain"
        failing = "" if r["first_failing"] is None else f" ({r['first_failing']} did not)"
        lines.append(f"  {r['strategy']:<11} batch {r['batch_size']}{failing}{larger}")
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
