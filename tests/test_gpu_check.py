"""scripts/gpu_check.py: the one command a session with a GPU runs to check memgrad's claims.

Here (no GPU) it must say so in one line and exit 0; its checks run the same on the CPU, which
is how their logic is tested (the figures a GPU gives go to BENCHMARKS.md).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_check  # noqa: E402


@pytest.mark.slow  # a fresh interpreter imports TensorFlow to see there is no GPU: 10 s
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == [
        "gpu_check: no GPU is visible to TensorFlow, nothing to check "
        "(--device CPU:0 runs the same checks on the CPU)."]


def test_every_check_has_its_cpu_figure_and_a_missed_claim_fails_the_run(monkeypatch, capsys):
    assert set(gpu_check.CPU_FIGURES) >= {"gpt2/memory", "gpt2/budget", "reversible/eager",
                                          "reversible/graph", "lstm/memory", "profiler/categories"}
    assert all("0.00x" not in figure for figure in gpu_check.CPU_FIGURES.values())
    monkeypatch.setattr(gpu_check, "check_lstm", lambda device: [gpu_check._row(
        "lstm/memory", "claim", "0.90x", False)])
    assert gpu_check.main(["--device", "CPU:0", "--check", "lstm"]) == 1
    assert "| lstm/memory | claim | 0.27x" in capsys.readouterr().out


@pytest.mark.memory
def test_the_profiler_check_holds_on_the_cpu():
    rows = gpu_check.check_profiler("CPU:0")
    assert [row["check"] for row in rows] == ["profiler/known buffer", "profiler/categories"]
    assert all(row["met"] for row in rows), rows
