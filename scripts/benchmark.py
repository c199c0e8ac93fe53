"""memgrad's benchmark suite: time and memory ratios, each measured side by side in one run.

Timing is not asserted in the tests (wall time is noisy); it lives here. Every
variant is timed against plain backprop of the *same* network, in interleaved
rounds (variant, baseline, variant, ...), and the ratio of medians is reported.

The suites live in the package beside this file, `scripts/benchmarks/`, one module each
(`common.py` holds what they share, `report.py` the targets and the table); this file runs them.

Usage:
  python scripts/benchmark.py                      # every suite, print a markdown table
  python scripts/benchmark.py --suite reversible --rounds 20 --markdown reversible.md
  python scripts/benchmark.py --suite loops --check   # exit 1 when a stated target is missed
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.budget import budget_suite
from benchmarks.checkpointing import checkpointing_suite
from benchmarks.higher import higher_suite
from benchmarks.loops import long_suite, loops_suite
from benchmarks.peers import peers_suite
from benchmarks.recompute import recompute_suite
from benchmarks.report import markdown, missed
from benchmarks.reversible import reversible_suite
from benchmarks.selective import selective_suite
from benchmarks.speed import speed_suite
from benchmarks.xla import xla_suite
from benchmarks.zoo import zoo_suite

SUITES = {
    "budget": budget_suite,
    "higher": higher_suite,
    "loops": loops_suite,
    "long": long_suite,
    "peers": peers_suite,
    "recompute": recompute_suite,
    "checkpointing": checkpointing_suite,
    "reversible": reversible_suite,
    "selective": selective_suite,
    "speed": speed_suite,
    "xla": xla_suite,
    "zoo": zoo_suite,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), action="append",
                        help="suite to run (repeatable; default: all)")
    parser.add_argument("--peers", action="store_true", help="the peers suite (same as --suite peers)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per variant (default: 15)")
    parser.add_argument("--markdown", metavar="PATH",
                        help="also write the table to PATH, a new file (an existing one is refused: "
                             "BENCHMARKS.md has hand-written sections; paste the rows into it)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the run misses a stated target (each is listed)")
    args = parser.parse_args(argv)
    if args.markdown and os.path.exists(args.markdown):
        # Checked before the suites run (they take minutes to hours): the table would
        # replace the whole file.
        parser.error(f"--markdown expected a new file; received {args.markdown!r}, which exists "
                     f"(the table would replace all of it: give a new path and paste the rows in)")
    rows = []
    if args.peers:
        args.suite = (args.suite or []) + ["peers"]
    for suite in args.suite or sorted(SUITES):
        rows += SUITES[suite](args.rounds)
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write("# memgrad benchmarks\n\nWritten by `python scripts/benchmark.py`.\n\n" + table + "\n")
    misses = missed(rows)
    for line in misses:
        print(f"missed: {line}", file=sys.stderr)
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
