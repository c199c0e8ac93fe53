"""scripts/benchmark.py --check: a stated target the run misses fails the run, each named."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchmark  # noqa: E402
from benchmarks import peers, report  # noqa: E402


def _row(suite, time_ratio, memory_ratio=0.5, **extra):
    return {"suite": suite, "case": f"a {suite} case", "time_ratio": time_ratio,
            "memory_ratio": memory_ratio, "ms_memgrad": 2.0, "ms_plain": 1.0, "ms": 2.0,
            "peak_mib": 1.0, "vs_memgrad_no_xla": 1.0, "device": "CPU:0", "failure": None, **extra}


MET = [
    _row("zoo", 1.2, target=1.3),
    _row("budget", 1.1, target_text="<= 3 s (met)"),
    _row("xla", 1.3, variant="memgrad XLA"),
    _row("xla", 2.0, variant="plain XLA"),  # no target of its own
    _row("loops", 1.3, 0.30, variant="memgrad.GradientTape('memory')"),
    _row("loops", 3.0, 1.50, variant="tf.recompute_grad around the cell"),  # a peer: no target
    {"suite": "peers", "case": "a peer", "variant": "x", "failure": "it raised"},
    _row("higher", 1.9, 0.80, variant="memory", gradient_error=1e-6, calls="2 / 0 / 0"),
    _row("higher", 1.0, 1.25, variant="memory inner, plain outer", gradient_error=1e-6, calls="1 / 0 / 0"),
    _row("speed", 1.05, 0.90, variant="memgrad 'speed'"),
    _row("speed", 1.50, 1.00, variant="plain"),  # the baseline: no target of its own
]
MISSED = [
    _row("zoo", 1.31, target=1.3),
    _row("budget", 1.1, target_text="time <= sqrt(n) spacing's (missed), peak <= budget (met)"),
    _row("xla", 1.36, variant="memgrad XLA"),
    _row("loops", 1.3, 0.36, variant="memgrad.GradientTape('memory')"),
    _row("loops", 1.41, 0.30, variant="memgrad.GradientTape('memory')"),
    _row("higher", 1.9, 0.95, variant="memory", gradient_error=1e-6, calls="2 / 0 / 0"),
    _row("higher", 1.9, 0.80, variant="memory", gradient_error=2e-5, calls="2 / 0 / 0"),
    _row("speed", 1.06, 0.90, variant="memgrad 'speed'"),
]


def test_every_kind_of_target_is_checked():
    assert benchmark.missed(MET) == []
    lines = benchmark.missed(MISSED)
    assert len(lines) == len(MISSED), lines
    assert lines[0] == "zoo: a zoo case: time 1.31x > 1.3x"
    assert "(missed)" in lines[1] and "[memgrad XLA]: time 1.36x > 1.35x" in lines[2]
    assert "peak 0.36x (<= 0.35x)" in lines[3] and "time 1.41x (<= 1.4x)" in lines[4]
    assert "peak 0.95x (<= 0.9x)" in lines[5] and "gradient error 2.0e-05 (<= 1e-05)" in lines[6]
    assert lines[7] == "speed: a speed case [memgrad 'speed']: time 1.06x > 1.05x"
    table = benchmark.markdown(MET[-4:-2])  # the gradients-of-gradients table
    assert "| memory | 1.90x | 2.0 | 0.80x | 1.0 | 1.0e-06 | 2 / 0 / 0 |" in table


def test_check_exits_1_on_a_miss_and_names_it(monkeypatch, capsys):
    monkeypatch.setitem(benchmark.SUITES, "zoo", lambda rounds: [MET[0], MISSED[0]])
    assert benchmark.main(["--suite", "zoo", "--rounds", "1"]) == 0  # without --check: reported only
    assert benchmark.main(["--suite", "zoo", "--rounds", "1", "--check"]) == 1
    assert "missed: zoo: a zoo case: time 1.31x > 1.3x" in capsys.readouterr().err
    monkeypatch.setitem(benchmark.SUITES, "zoo", lambda rounds: [MET[0]])
    assert benchmark.main(["--suite", "zoo", "--rounds", "1", "--check"]) == 0


def test_markdown_refuses_an_existing_file_before_any_suite_runs(tmp_path, monkeypatch, capsys):
    """The table replaces a whole file: BENCHMARKS.md's hand-written sections would be lost."""
    existing = tmp_path / "BENCHMARKS.md"
    existing.write_text("hand-written\n")
    ran = []
    monkeypatch.setitem(benchmark.SUITES, "zoo", lambda rounds: ran.append(rounds) or [])
    try:
        benchmark.main(["--suite", "zoo", "--markdown", str(existing)])
    except SystemExit as exit_:
        assert exit_.code == 2
    else:
        raise AssertionError("an existing --markdown file was accepted")
    assert "expected a new file" in capsys.readouterr().err and ran == []
    assert existing.read_text() == "hand-written\n"
    fresh = tmp_path / "zoo.md"
    assert benchmark.main(["--suite", "zoo", "--rounds", "1", "--markdown", str(fresh)]) == 0
    assert ran == [1] and fresh.read_text().startswith("# memgrad benchmarks")


def test_peer_rows_give_each_variants_fastest_and_slowest_round(monkeypatch):
    """A peers or loops row shows its time spread, not a median alone."""
    monkeypatch.setattr(peers, "time_rounds",
                        lambda steps, x, rounds: {"plain": [0.010, 0.012, 0.030], "peer": [0.020, 0.021, 0.025]})
    monkeypatch.setattr(peers, "median_peak", lambda step, x: {"plain": 4.0, "peer": 2.0}[step] * 2**20)
    rows = peers.peer_rows("a case", {"plain": "plain", "peer": "peer"}, None, 3)
    assert [row["ms_range"] for row in rows] == [(10.0, 30.0), (20.0, 25.0)]
    assert rows[1]["time_ratio"] == 0.021 / 0.012 and rows[1]["memory_ratio"] == 0.5
    table = report.variant_table(["intro"], rows)
    assert "ms/step: median (fastest-slowest round)" in table[3]
    assert table[-1] == "| a case | peer | 1.75x | 21.0 (20.0-25.0) | 0.50x | 2.0 |"
