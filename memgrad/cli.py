"""`memgrad-profile`: profile a training step's peak memory at several depths."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memgrad-profile",
        description=(
            "Measure the peak memory and time of one training step of a plain deep MLP "
            "(tanh, width x width layers) at several depths, on GPU if present else CPU."
        ),
    )
    parser.add_argument("--depths", type=_positive_int, nargs="+", default=[4, 8, 16, 32],
                        help="network depths to profile (default: 4 8 16 32)")
    parser.add_argument("--batch-size", type=_positive_int, default=256, help="batch size (default: 256)")
    parser.add_argument("--width", type=_positive_int, default=512, help="units per layer (default: 512)")
    parser.add_argument("--device", default=None, help="'CPU:0', 'GPU:0', ... (default: GPU:0 if present)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    return parser


def profile_mlp(depths, batch_size, width, device=None):
    """Measures one MLP training step per depth.

    Args:
      depths: iterable of depths.
      batch_size: rows per batch.
      width: units per layer.
      device: device to measure on, or ``None`` for the default.

    Returns:
      A list of dicts, one per depth, with the depth, the `MemoryReport` fields
      and ``activation_bytes``: the analytic size of the layer outputs kept for
      backprop (``depth * batch_size * width * 4``).
    """
    from memgrad.profiler import measure, resolve_device
    from memgrad.profiler.workloads import build_mlp_step, mlp_batch

    device = resolve_device(device)
    rows = []
    for depth in depths:
        step, _ = build_mlp_step(depth, width)
        report = measure(step, args=mlp_batch(batch_size, width), device=device)
        rows.append({"depth": depth, "batch_size": batch_size, "width": width,
                     "activation_bytes": depth * batch_size * width * 4, **report.as_dict()})
    return rows


def format_table(rows) -> str:
    """Renders profile rows as a fixed-width text table."""
    header = f"{'depth':>6} {'peak MiB':>10} {'above base MiB':>15} {'activations MiB':>16} {'ms/step':>9}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['depth']:>6} {row['peak_bytes'] / 2**20:>10.2f} "
            f"{row['peak_above_baseline_bytes'] / 2**20:>15.2f} "
            f"{row['activation_bytes'] / 2**20:>16.2f} {row['wall_time_s'] * 1e3:>9.1f}"
        )
    return "\n".join(lines)


def _rerun_with_exact_cpu_stats(argv) -> None:
    """Re-executes this command with the BFC CPU allocator, whose statistics count every byte.

    The variable only takes effect before TensorFlow is imported, and importing
    memgrad imports TensorFlow, so the command starts itself again.
    """
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") is None:
        env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.execve(sys.executable, [sys.executable, "-m", "memgrad.cli", *argv], env)


def main(argv=None) -> int:
    """Runs the command; returns its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    _rerun_with_exact_cpu_stats(argv)
    try:
        rows = profile_mlp(args.depths, args.batch_size, args.width, args.device)
    except (ValueError, RuntimeError) as error:
        print(f"memgrad-profile: error: {error}", file=sys.stderr)
        return 2
    device = rows[0]["device"]
    print(f"Plain backprop, MLP width {args.width}, batch {args.batch_size}, on {device}")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
