"""`memgrad-profile`'s arguments: the parser and the names it offers.

This module imports the standard library only, so that ``memgrad-profile --help`` prints
at once: the launcher (``memgrad_profile``) loads this file by its path, without importing
the ``memgrad`` package and so TensorFlow (seconds), when the arguments ask for help. A
``--budget`` is read with `memgrad.profiler.parse_bytes`, imported when one is given.
"""

from __future__ import annotations

import argparse
import collections
import re

STRATEGIES = ("plain", "memory", "speed", "reversible", "selective")
BUILT_IN = ("coupling", "resnet", "revnet", "densenet", "glow")
# Timed rounds per point, and fewer for slow steps (steps of seconds vary little).
TIMED_ROUNDS = 7
SLOW_STEP_ROUNDS = 3
SLOW_STEP_S = 0.4


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}")
    return value


class _Budget(collections.namedtuple("_Budget", "text bytes")):
    """A ``--budget`` as typed and in bytes."""

    @property
    def decimal(self) -> bool:
        """Whether it was given in decimal units (kB, MB, GB, TB): then every figure is in MB."""
        return re.search(r"\d\s*[kmgt]b\s*$", self.text, re.IGNORECASE) is not None  # as parse_bytes reads units


def budget_argument(text: str) -> _Budget:
    """``--budget``'s type: the text as typed and its bytes (at least 1 MiB)."""
    from memgrad.profiler import parse_bytes

    try:
        value = parse_bytes(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a memory size such as 512MB, 1.5GiB or 300000000, received {text!r}") from None
    if value < 2**20:
        raise argparse.ArgumentTypeError(f"expected a budget of at least 1 MiB, received {text!r}")
    return _Budget(text, value)


FAST_STEP_S = 0.2  # steps faster than this are timed side by side (rebuilt after profiling)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memgrad-profile",
        description=(
            "Profile one training step of a model under each memory strategy (plain backprop, "
            "automatic checkpointing 'memory'/'speed', reversible, selective) over depths and batch "
            "sizes, on GPU if present else CPU: peak memory, ratio to plain, time per step. With no "
            "arguments: additive-coupling stacks of depth 2-16, plain vs checkpointed vs reversible."
        ),
        epilog=(
            "Examples: memgrad-profile | memgrad-profile --model resnet --depths 20 56 "
            "| memgrad-profile --model my.keras --batch-sizes 16 64 --budget 512MB "
            "| memgrad-profile --model mypkg.nets:build --depths 8 16 --top 5"
        ),
    )
    parser.add_argument("--model", default="coupling",
                        help=f"one of {', '.join(BUILT_IN)} (default: coupling), a .keras file "
                             "(loaded with safe_mode=True) or a builder 'module:function' returning a "
                             "Keras model (called with depth=D when --depths is given)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, metavar="STRATEGY",
                        help=f"some of {', '.join(STRATEGIES)} (default: plain memory reversible for the "
                             "default model, else every strategy the model supports)")
    parser.add_argument("--depths", type=_positive_int, nargs="+",
                        help="depths to sweep (default: the model's own, e.g. 2 4 8 16 couplings)")
    parser.add_argument("--batch-sizes", type=_positive_int, nargs="+", help="batch sizes to sweep")
    parser.add_argument("--width", type=_positive_int, default=256,
                        help="features of the coupling model (even; default: 256)")
    parser.add_argument("--repeats", type=_positive_int, default=3,
                        help="profiled steps per point; the one with the highest peak gives the peak, "
                             "the categories and --top (default: 3); the time is the median of "
                             f"{TIMED_ROUNDS} timed rounds ({SLOW_STEP_ROUNDS} when a step takes "
                             f"over {SLOW_STEP_S:g} s); steps under {FAST_STEP_S:g} s are timed "
                             "side by side, every strategy in turn in each round")
    parser.add_argument("--device", default=None, help="'CPU:0', 'GPU:0', ... (default: GPU:0 if present)")
    parser.add_argument("--json", metavar="PATH", default="memgrad-profile.json",
                        help="where to write the results (default: memgrad-profile.json)")
    parser.add_argument("--plot", metavar="PATH", default="memgrad-profile.png",
                        help="where to draw peak memory and time overhead (default: memgrad-profile.png)")
    parser.add_argument("--budget", type=budget_argument, metavar="SIZE",
                        help="also find the largest batch that fits SIZE (e.g. 512MB) per strategy, "
                             "at the deepest depth, on an emulated device capped at SIZE")
    parser.add_argument("--top", type=_positive_int, metavar="K",
                        help="also list the K largest tensors alive at each strategy's peak")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser
