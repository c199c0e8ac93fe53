"""memgrad-profile: the default headline run, --budget, --top, model sources, output files, errors."""

import atexit
import json
import os
import re
import shutil
import tempfile

import keras
import numpy as np
import pytest

import memgrad
from memgrad.cli import profile as cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_RUNS = tempfile.mkdtemp(prefix="memgrad-cli-tests-")
atexit.register(shutil.rmtree, _RUNS, ignore_errors=True)  # made at import: gone when pytest exits
DEFAULT_DIR = os.path.join(_RUNS, "default")
BUDGET_DIR = os.path.join(_RUNS, "budget")
BUDGET_ARGS = ["--width", "64", "--depths", "16", "--batch-sizes", "64", "--strategies", "plain", "reversible",
               "--budget", "24MB", "--repeats", "1", "--no-progress"]

# The two slow runs go in fresh processes, started in the background when collection ends
# (tests/conftest.py); the `fresh_results` fixture waits for them.
BUILDER_DIR = os.path.join(_RUNS, "builder")
BUILDER_ARGS = ["--model", "tests.cli_builders:mlp", "--depths", "2", "6", "--batch-sizes", "1024",
                "--strategies", "plain", "memory", "--top", "3", "--repeats", "1", "--no-progress"]
OOM_DIR = os.path.join(_RUNS, "oom")
OOM_ARGS = ["--width", "64", "--depths", "16", "--batch-sizes", "3000", "--strategies", "plain", "memory",
            "--repeats", "1", "--no-progress", "--plot", ""]
# expected_s: each probe's wall time in CI's memory pass (the longest start first, conftest.py).
FRESH_PROCESSES = {
    # A 22 MiB device: plain backprop runs out of memory at batch 3000, checkpointing fits (11 MiB).
    "oom": dict(target="tests.cli_probe:run", args=[OOM_DIR, OOM_ARGS, {"TF_CPU_BFC_MEM_LIMIT_IN_MB": "22"}],
                timeout=1500, expected_s=60),
    "default": dict(target="tests.cli_probe:run", args=[DEFAULT_DIR], timeout=1500),
    "builder": dict(target="tests.cli_probe:run", args=[BUILDER_DIR, BUILDER_ARGS], timeout=1500),
    "budget": dict(target="tests.cli_probe:run", args=[BUDGET_DIR, BUDGET_ARGS], timeout=1500,
                   expected_s=180),  # 12 capped runs, 7 of them out of memory (10 s wait each)
}


@pytest.fixture(scope="module")
def runs(fresh_results):
    return fresh_results


def _assert_png(path):
    import matplotlib.image

    with open(path, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def _leaked(stderr):
    """Lines of stderr other than the progress bar's."""
    lines = [line.strip() for line in stderr.replace("\r", "\n").splitlines()]
    return [line for line in lines if line and not line.startswith("memgrad-profile:")]


def _assert_schema(result):
    assert set(result) >= {"command", "model", "device", "strategies", "depths", "batch_sizes", "versions",
                           "rows", "budget", "top", "half_precision_kernels"}
    assert set(result["versions"]) == {"memgrad", "tensorflow", "keras", "python"}
    for row in result["rows"]:
        assert set(row) == {"model", "strategy", "depth", "batch_size", "peak_bytes", "peak_above_baseline_bytes",
                            "ms_per_step", "time_spread", "memory_ratio", "time_overhead", "out_of_memory",
                            "categories", "oom_report", "half_precision"}
        assert row["half_precision"] is False  # float32 models: no kernel check in the result
        assert row["strategy"] in result["strategies"] and row["batch_size"] in result["batch_sizes"]
        assert isinstance(row["peak_bytes"], int) and isinstance(row["peak_above_baseline_bytes"], int)
        assert row["ms_per_step"] > 0 and row["time_spread"] >= 0 and row["out_of_memory"] is False
        # Memory by category, from one more (profiled) step, sums to the measured peak (weights
        # included). The BFC allocator rounds a buffer up to its chunk (up to 2x), so two steps'
        # peaks may differ by a chunk: up to 10% on these 1-4 MiB steps. test_categories.py
        # asserts 5% on larger steps.
        assert set(row["categories"]) == {"weights", "optimizer", "inputs_and_other", "activations",
                                          "gradients", "temporaries"}
        assert sum(row["categories"].values()) == pytest.approx(row["peak_bytes"], rel=0.05, abs=2**19), row
        if row["strategy"] == "plain":
            assert row["memory_ratio"] == 1.0 and row["time_overhead"] == 1.0


@pytest.mark.memory
def test_default_run_shows_memory_vs_depth_for_plain_checkpointed_reversible(runs):
    run = runs["default"]
    assert run["status"] == 0, run["stderr"]
    result = run["json"]
    _assert_schema(result)
    assert result["model"] == "coupling" and result["strategies"] == ["plain", "memory", "reversible"]
    assert result["depths"] == [2, 4, 8, 16] and result["device"] == "CPU:0"
    peaks = {(r["strategy"], r["depth"]): r["peak_above_baseline_bytes"] for r in result["rows"]}
    ratios = {(r["strategy"], r["depth"]): r["memory_ratio"] for r in result["rows"]}
    # Plain backprop grows with depth; the reversible stack does not; checkpointing grows slower.
    # Measured in 32 fresh runs of the command (20 alone, 12 beside two CPU-bound processes):
    # plain 8.8-9.4 MiB at depth 16, reversible 2.5-3.1 MiB at every depth (activations carried
    # in float64 around the float32 network), a few allocator chunks apart from run to run.
    # Ratios at 16: reversible 0.275-0.331x (median 0.308, sd 0.014), memory 0.38-0.43x; one
    # CI run beside a CPU-bound process read 0.352x. The bounds sit 0.05 (reversible, about
    # 3 sd) and 0.12 (memory) above the largest readings, and far under plain's 1.0x.
    assert peaks["plain", 16] > 3 * peaks["plain", 2]
    assert peaks["reversible", 16] < 1.5 * peaks["reversible", 2]
    assert ratios["reversible", 16] < 0.40 and ratios["memory", 16] < 0.55, ratios
    assert "peak MiB" in run["stdout"] and "wrote memgrad-profile.png" in run["stdout"]
    (drift,) = result["drift"]  # the coupling model's one stack, 16 blocks, float64 carry
    assert len(drift["errors"]) == 16 and drift["max_error"] < 1e-10 and drift["nonfinite_blocks"] == []
    assert "reversible drift (depth 16" in run["stdout"]
    assert "Traceback" not in run["stderr"]
    # Nothing from TensorFlow leaks: no C++ start-up lines, no retracing notices, no warnings;
    # stderr holds the progress bar only.
    assert _leaked(run["stderr"]) == [], run["stderr"]
    # Plain backprop's peak holds every block's activations; the reversible stack's holds a few
    # rebuilt ones (measured 8.8-9.1 vs 2.5-3.2 MiB: 2.7-3.7x).
    categories = {r["strategy"]: r["categories"] for r in result["rows"] if r["depth"] == 16}
    assert categories["plain"]["activations"] > 2 * categories["reversible"]["activations"], categories
    assert categories["plain"]["weights"] == categories["memory"]["weights"] > 0
    assert "what the peak holds (depth 16, batch 256)" in run["stdout"]
    # One basis for "peak": what the peak holds adds up to the table's figure, what was held
    # before the step is said once, and the JSON states the basis.
    plain_row = next(r for r in result["rows"] if r["strategy"] == "plain" and r["depth"] == 16)
    table_line = next(line for line in run["stdout"].splitlines() if line.startswith("  peak (as in the table)"))
    assert float(table_line.split()[5]) == round(plain_row["peak_above_baseline_bytes"] / 2**20, 2)
    assert "held before the step and not counted" in run["stdout"] and "MB" not in run["stdout"].replace("MiB", "")
    assert result["peak"].startswith("peak: what one training step allocates above the weights and inputs")
    # The stack is named as in the model; exact rebuilding says so, not "largest 0.0e+00".
    assert "couplings   16 blocks in float64" in run["stdout"] and "0.0e+00" not in run["stdout"]
    # The progress bar counts profiled points, in words.
    assert "12 of 12 points profiled" in run["stderr"] and "s/step" not in run["stderr"]
    _assert_png(os.path.join(DEFAULT_DIR, "memgrad-profile.png"))


def test_drift_section_reports_every_block_of_every_reversible_stack():
    from memgrad.cli.drift import format_drift, measure_drift
    from memgrad.cli.sweep import model_spec

    (row,) = measure_drift(model_spec("coupling", width=64), 4, 8)
    assert row["blocks"] == 4 and len(row["errors"]) == 4 and row["invertible_dtype"] == "float64"
    assert all(0.0 <= e < 1e-10 for e in row["errors"]) and row["nonfinite_blocks"] == []
    assert row["stack"] == "couplings"  # the model's own name for its stack
    exact = format_drift([dict(row, max_error=0.0, worst_block=0)], "depth 4, batch 8")
    assert exact.startswith("reversible drift (depth 4, batch 8, one training step")
    assert exact.endswith("couplings    4 blocks in float64  none: every block's input rebuilt exactly")
    close = format_drift([dict(row, max_error=3e-7, worst_block=2)], "depth 4, batch 8")
    assert close.endswith("largest 3.0e-07 at block 2, within the tolerance 1e-05: ok"), close
    assert "above the tolerance" in format_drift([dict(row, max_error=1.0)], "depth 4, batch 8")
    assert "NaN/inf at blocks 0, 2" in format_drift([dict(row, nonfinite_blocks=[0, 2])], "depth 4, batch 8")


@pytest.mark.parametrize("text, decimal", [("24MB", True), ("512mb", True), ("1.5 GB", True), ("2000kB", True),
                                           ("512MiB", False), ("512M", False), ("300000000", False)])
def test_a_budget_in_decimal_units_shows_every_figure_in_mb(text, decimal):
    """Decimal exactly where parse_bytes reads a power of 1000 (units are case-insensitive)."""
    from memgrad.profiler import parse_bytes

    budget = cli.budget_argument(text)
    assert budget.decimal is decimal and budget.bytes == parse_bytes(text)


def _docs_sample(command):
    """The sample output in docs/profiler.md of ``$ <command>``, without its command line."""
    from tests.test_docs_examples import fenced_blocks

    for _, language, code, _ in fenced_blocks("docs/profiler.md"):
        first, _, rest = code.partition("\n")
        if language == "text" and first == f"$ {command}":
            return rest
    raise AssertionError(f"docs/profiler.md shows no output of {command!r}")


@pytest.mark.memory
@pytest.mark.parametrize("run_name, command", [
    ("default", "memgrad-profile --json ''"),
    ("budget", "memgrad-profile " + " ".join(a for a in BUDGET_ARGS if a not in ("--repeats", "1", "--no-progress"))),
])
def test_the_docs_sample_outputs_are_what_the_command_prints(runs, run_name, command):
    """Line for line, every number a '#'; the runs here write files, the samples do not."""
    from tests.test_docs_examples import sample_mismatch

    def steady(text):
        # The float64 carry rebuilt every input exactly in the runs measured; an error within the
        # tolerance, should a run show one, reads the same here.
        text = re.sub(r"largest \S+ at block \d+, within the tolerance \S+: ok",
                      "none: every block's input rebuilt exactly", text)
        return "\n".join(line for line in text.splitlines()
                         if not line.startswith(("wrote ", "* timed rounds differ")))

    run = runs[run_name]
    assert run["status"] == 0, run["stderr"]
    printed, sample = steady(run["stdout"]), steady(_docs_sample(command))
    assert sample_mismatch(sample, printed) is None, sample_mismatch(sample, printed)


@pytest.mark.memory
def test_budget_finds_a_larger_batch_for_the_reversible_stack(runs):
    run = runs["budget"]
    assert run["status"] == 0, run["stderr"]
    found = {entry["strategy"]: entry for entry in run["json"]["budget"]}
    plain, reversible = found["plain"], found["reversible"]
    assert 0 < plain["batch_size"] < plain["first_failing"]
    # Measured on the emulated 24 MB device: 1,911 vs 5,304-5,364 (2.8x; the stack carries its
    # activations in float64).
    assert reversible["batch_size"] > 2 * plain["batch_size"], found
    assert reversible["vs_plain"] == pytest.approx(reversible["batch_size"] / plain["batch_size"])
    assert reversible["budget_bytes"] == 22 * 2**20  # 24 MB rounded down to whole MiB
    # The budget was given in MB, so every figure is (the 22 MiB cap is 23.07 MB).
    assert "peak MB" in run["stdout"] and "capped at 23.07 MB" in run["stdout"], run["stdout"]
    assert "MiB" not in run["stdout"], run["stdout"]
    assert "fits" in run["stdout"] and "the batch of plain" in run["stdout"]
    # The batch predicted from traced steps alone is shown next to the measured one.
    for entry in found.values():
        assert entry["prediction_error"] is None and entry["predicted_batch_size"] > 0, entry
    assert f"predicted {plain['predicted_batch_size']} without a run" in run["stdout"]


def _run(capsys, *arguments):
    status = cli.main(["--no-progress", "--repeats", "1", "--device", "CPU:0", *arguments])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.slow
def test_a_half_precision_model_gets_the_kernel_check(tmp_path, capsys):
    """A mixed_float16 model: the JSON carries the check of this CPU's half-precision kernels,
    and the output warns exactly when one of them is wrong here."""
    layer = keras.layers.EinsumDense("...b,bc->...c", output_shape=8, dtype="mixed_float16")
    model = keras.Sequential([keras.Input((4, 16)), layer, keras.layers.Dense(4, dtype="mixed_float16")])
    path = str(tmp_path / "half.keras")
    model.save(path)
    out_json = tmp_path / "r.json"
    status, out, err = _run(capsys, "--model", path, "--batch-sizes", "8", "--strategies", "plain",
                            "--json", str(out_json))
    assert status == 0, err
    result = json.loads(out_json.read_text())
    assert [row["half_precision"] for row in result["rows"]] == [True]
    check = memgrad.profiler.check_half_precision_kernels()
    assert result["half_precision_kernels"] == json.loads(json.dumps(check.as_dict()))
    assert ("warning: " in out) == bool(check.wrong)


@pytest.mark.slow
def test_a_keras_file_under_each_strategy_it_supports(tmp_path, capsys):
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32), keras.layers.ReLU(),
                              keras.layers.Dense(4)])
    path = str(tmp_path / "small.keras")
    model.save(path)
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    status, out, err = _run(capsys, "--model", path, "--batch-sizes", "8", "32",
                            "--json", str(out_json), "--plot", str(out_png))
    assert status == 0, err
    result = json.loads(out_json.read_text())
    _assert_schema(result)
    # Selective layers change nothing in a tf.function step: not profiled unless asked.
    assert result["strategies"] == ["plain", "memory", "speed"] and result["depths"] == [None]
    assert "model" in out.splitlines()[1].split() and "small.keras" in out and "depth" not in out.splitlines()[1]
    assert [(r["strategy"], r["batch_size"]) for r in result["rows"]][:2] == [("plain", 8), ("memory", 8)]
    _assert_png(out_png)  # a batch-size sweep: memory against batch size


@pytest.mark.memory
def test_a_builder_with_depths_and_the_largest_tensors_at_the_peak(runs):
    run = runs["builder"]
    assert run["status"] == 0, run["stderr"]
    result, out = run["json"], run["stdout"]
    _assert_schema(result)
    peaks = {(r["strategy"], r["depth"]): r["peak_above_baseline_bytes"] for r in result["rows"]}
    assert peaks["plain", 6] > peaks["plain", 2]
    top = result["top"]["plain"]
    assert top["depth"] == 6 and len(top["tensors"]) == 3
    assert all(set(t) == {"op", "shape", "dtype", "bytes", "layer", "category"} for t in top["tensors"])
    # The MLP's activations are [1024, 64] float32: 256 KiB each, kept for backprop by plain.
    assert top["tensors"][0]["bytes"] >= 1024 * 64 * 4 and top["tensors"][0]["dtype"] == "float32"
    assert top["tensors"][0]["category"] == "activations" and "dense" in top["tensors"][0]["layer"]
    assert top["peak_above_baseline_bytes"] >= sum(t["bytes"] for t in top["tensors"])
    # --top profiles the very step the table measured (one op at a time): the same peak
    # (measured 0.2-2.2% apart over two runs, for plain, memory and speed).
    for strategy in ("plain", "memory"):
        assert result["top"][strategy]["peak_above_baseline_bytes"] == pytest.approx(
            peaks[strategy, 6], rel=0.05), (strategy, result["top"][strategy], peaks)
    assert "largest tensors alive at the peak" in out
    assert run["stderr"].strip() == "", run["stderr"]


@pytest.mark.memory
def test_a_point_that_runs_out_of_memory_prints_what_was_alive_and_what_others_needed(runs):
    run = runs["oom"]
    assert run["status"] == 0, run["stderr"]
    rows = {r["strategy"]: r for r in run["json"]["rows"]}
    assert rows["plain"]["out_of_memory"] and not rows["memory"]["out_of_memory"], rows
    report = rows["plain"]["oom_report"]
    assert "OOM when allocating tensor with shape" in report["message"]
    tensors = report["memory"]["tensors"]
    # Plain backprop dies holding the blocks' activations: [3000, 32] float32 and larger.
    assert tensors[0]["bytes"] >= 3000 * 32 * 4 and tensors[0]["category"] == "activations", tensors
    assert "plain at depth 16, batch 3000 ran out of memory" in run["stdout"]
    assert "largest tensors alive when it failed" in run["stdout"]
    assert "what the other strategies needed here (peak above the weights and inputs): memory " in run["stdout"]
    assert _leaked(run["stderr"]) == []


def test_onednn_under_a_cap_is_detected_only_with_both(monkeypatch):
    from memgrad._src import tf_internals

    for capped, onednn, expected in (("22", True, True), ("22", False, False), (None, True, False)):
        if capped is None:
            monkeypatch.delenv(cli.CAP_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(cli.CAP_VARIABLE, capped)
        monkeypatch.setattr(tf_internals, "onednn_enabled", lambda onednn=onednn: onednn)
        assert cli._onednn_under_a_cap() is expected, (capped, onednn)


def test_the_launcher_turns_onednn_off_under_a_cap_unless_the_user_chose(monkeypatch):
    import sys

    import memgrad_profile

    monkeypatch.setitem(sys.modules, "memgrad.cli", type(sys)("memgrad.cli"))  # no run: records the env
    seen = []
    sys.modules["memgrad.cli"].main = lambda argv: seen.append(os.environ.get(cli.ONEDNN_VARIABLE)) or 0
    # setenv first, so monkeypatch restores both variables (unset) after the test: its delenv
    # of an unset variable records nothing, and the launcher's setdefault leaked "0" into the
    # process (a later test of the kernel choice then read it).
    for name in (cli.CAP_VARIABLE, cli.ONEDNN_VARIABLE):
        monkeypatch.setenv(name, "")
    for cap, chosen, expected in (("22", None, "0"), ("22", "1", "1"), (None, None, None)):
        for name, value in ((cli.CAP_VARIABLE, cap), (cli.ONEDNN_VARIABLE, chosen)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert memgrad_profile.main([]) == 0
        assert seen[-1] == expected, (cap, chosen, seen)


def test_help_is_answered_without_importing_tensorflow():
    """``memgrad-profile --help`` prints the same help as the command's parser, from a fresh
    interpreter in which neither memgrad nor TensorFlow gets imported (importing them took
    8-13 s on a 2-core CPU)."""
    import subprocess
    import sys

    probe = ("import sys, memgrad_profile\n"
             "try:\n    memgrad_profile.main(['--model', 'resnet', '--help'])\n"
             "except SystemExit as done:\n    code = done.code\n"
             "print('EXIT', code, sorted({'tensorflow', 'memgrad'} & set(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    help_text, last = done.stdout.rsplit("EXIT", 1)
    assert last.split() == ["0", "[]"], done.stdout
    # Whitespace aside: the wrapping follows the terminal's width (a hyphenated default breaks).
    assert "".join(help_text.split()) == "".join(cli.build_parser().format_help().split())


@pytest.mark.parametrize("arguments, message", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--model", "glow", "--strategies", "selective"], "has no 'selective' strategy"),
    (["--model", "missing.keras"], "does not exist"),
    (["--model", "no_such_module_x:build"], "cannot import builder"),
    (["--model", "tests.cli_builders:not_a_model", "--depths", "2"], "must return a keras.Model"),
    (["--model", "resnet", "--depths", "7"], "resnet at depth 7"),
    (["--width", "63", "--depths", "2"], "even width"),
    (["--depths", "2", "--device", "TPU:9"], "device"),
])
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(capsys, arguments, message):
    status, out, err = _run(capsys, *arguments, "--json", "", "--plot", "")
    assert status == 2
    err = err.strip()
    assert err.startswith("memgrad-profile: error:") and "\n" not in err and message in err, err
    assert "Traceback" not in err


def _saved_model_bytes(tmp_path):
    path = tmp_path / "whole.keras"
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(str(path))
    return path.read_bytes()


def _zip_without_config(tmp_path):
    import zipfile

    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "not a model")
    return path.read_bytes()


@pytest.mark.parametrize("content, reason", [
    (lambda tmp: np.random.default_rng(0).bytes(2000), "File is not a zip file"),
    (lambda tmp: _saved_model_bytes(tmp)[:-100], "File is not a zip file"),  # a truncated download
    (lambda tmp: b"", "File is not a zip file"),
    (lambda tmp: _zip_without_config(tmp), "There is no item named 'config.json' in the archive"),
], ids=["random bytes", "truncated zip", "empty", "zip without config.json"])
def test_an_unreadable_model_file_is_one_clear_line(tmp_path, capsys, content, reason):
    path = tmp_path / "broken.keras"
    path.write_bytes(content(tmp_path))
    status, out, err = _run(capsys, "--model", str(path), "--json", "", "--plot", "")
    err = err.strip()
    assert status == 2 and "\n" not in err and "File not found" not in err, err
    assert err.startswith(f"memgrad-profile: error: model file {str(path)!r} exists but is not a readable "
                          f"Keras model: {reason}"), err


def test_a_model_file_with_depths_is_rejected(tmp_path, capsys):
    path = tmp_path / "m.keras"
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(str(path))
    status, out, err = _run(capsys, "--model", str(path), "--depths", "4")
    assert status == 2 and "fixed depth" in err


@pytest.mark.parametrize("arguments, message", [
    (["--strategies", "fastest"], "invalid choice"),
    (["--budget", "lots"], "expected a memory size"),
    (["--budget", "10KB"], "at least 1 MiB"),
    (["--depths", "0"], "expected a positive integer"),
    (["--top", "-1"], "expected a positive integer"),
])
def test_malformed_arguments_exit_2_with_usage(capsys, arguments, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(arguments)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_plot_of_a_single_point_is_a_bar_chart(tmp_path):
    categories = dict(weights=1, optimizer=0, inputs_and_other=0, activations=5, gradients=1, temporaries=1)
    rows = [{"model": "m", "strategy": s, "depth": None, "batch_size": 8, "peak_bytes": 10,
             "peak_above_baseline_bytes": b, "ms_per_step": 1.0, "out_of_memory": False,
             "categories": categories}
            for s, b in (("plain", 4 * 2**20), ("memory", 2**20))]
    cli._add_ratios(rows)
    assert [r["memory_ratio"] for r in rows] == [1.0, 0.25]
    cli.plot(rows, str(tmp_path / "bars.png"), "bars")
    _assert_png(tmp_path / "bars.png")
    assert np.isclose(rows[1]["time_overhead"], 1.0)


def test_one_line_picks_the_message_of_a_graph_or_keras_error():
    graph_error = ValueError("in user code:\n\n    File \"x.py\", line 3, in step  *\n        y = f(x)\n\n"
                             "    ValueError: shapes (2,) and (3,) are incompatible\n")
    assert cli.one_line(graph_error) == "ValueError: shapes (2,) and (3,) are incompatible"
    keras_error = ValueError("Exception encountered when calling Dense.call().\n\n"
                             "\x1b[1mThe custom_gradient decorator\n supports only eager.\x1b[0m\n\n"
                             "Arguments received by Dense.call():\n  • inputs=x")
    assert cli.one_line(keras_error) == "The custom_gradient decorator supports only eager."
    assert cli.one_line(OSError("first line\nsecond")) == "first line"
    assert cli.one_line(RuntimeError("")) == "RuntimeError"


def _table_rows(spreads):
    return [{"depth": 4, "batch_size": 8, "strategy": s, "out_of_memory": False,
             "peak_above_baseline_bytes": b * 2**20, "memory_ratio": r, "ms_per_step": ms,
             "time_overhead": ms / 10.0, "time_spread": spread}
            for (s, b, r, ms), spread in zip((("plain", 10, 1.0, 10.0), ("memory", 4, 0.4, 12.0)),
                                             spreads)]


def test_the_table_says_once_what_each_column_means():
    table = cli.format_table(_table_rows([0.03, 0.05]))
    header = table.splitlines()[0].split()
    assert header[:3] == ["depth", "batch", "strategy"]
    for column in ("peak MiB", "vs plain", "ms/step", "spread", "time vs plain"):
        assert column in table.splitlines()[0]
        assert sum(line.startswith(f"{column}: ") for line in table.splitlines()) == 1, column
    memory_line = next(line for line in table.splitlines() if " memory " in line)
    assert memory_line.split()[-3:] == ["12.0", "5%", "1.20x"]
    assert "more than 10%" not in table


def test_the_table_marks_times_whose_rounds_differ_by_more_than_ten_percent():
    table = cli.format_table(_table_rows([0.04, 0.25]))
    marked = [line for line in table.splitlines() if "25%*" in line]
    assert len(marked) == 1 and " memory " in marked[0]
    note = table.splitlines()[-1]
    assert note.startswith("* timed rounds differ by more than 10% (1 of 2 rows, up to 25%)")


def test_help_states_the_timed_rounds_the_code_runs():
    text = " ".join(cli.build_parser().format_help().split())
    assert f"the median of {cli.TIMED_ROUNDS} timed rounds ({cli.SLOW_STEP_ROUNDS} when a step " \
           f"takes over {cli.SLOW_STEP_S:g} s); steps under {cli.FAST_STEP_S:g} s are timed side " \
           "by side" in text
    import inspect
    assert inspect.signature(cli.time_steps).parameters["rounds"].default == cli.TIMED_ROUNDS


def test_the_plot_draws_the_spread_of_the_timed_rounds(tmp_path):
    rows = _table_rows([0.04, 0.25])
    for row in rows:
        row.update(model="m", peak_bytes=row["peak_above_baseline_bytes"], categories=None)
    cli.plot(rows, str(tmp_path / "spread.png"), "spread")
    _assert_png(tmp_path / "spread.png")


def test_the_docs_describe_every_option_and_the_timing_the_command_has():
    """docs/profiler.md and `memgrad-profile --help` agree: every option is documented, and
    the rounds and thresholds the docs state are the code's."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                        "profiler.md")
    with open(path, encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    parser = cli.build_parser()
    options = [o for action in parser._actions for o in action.option_strings
               if o.startswith("--") and o != "--help"]
    assert len(options) >= 10
    assert [o for o in options if o not in docs] == []
    assert f"timed side by side with the point's other strategies: {cli.TIMED_ROUNDS} rounds" in docs
    assert f"Steps faster than {cli.FAST_STEP_S:g} s" in docs
    assert f"{cli.TIMED_ROUNDS} rounds, {cli.SLOW_STEP_ROUNDS} for steps over {cli.SLOW_STEP_S:g} s" in docs
    repeats = next(a for a in parser._actions if "--repeats" in a.option_strings)
    assert f"`--repeats` times (default {repeats.default})" in docs
    from memgrad.cli.report import NOISY_SPREAD

    assert f"Above {NOISY_SPREAD:.0%}" in docs


def test_budget_search_reports_each_prediction_and_probe_on_stderr(monkeypatch, capsys):
    """--budget's searches run a subprocess per probe (minutes in all): each one is announced."""
    import memgrad.profiler
    from memgrad.cli import budget as cli_budget
    from memgrad.profiler import BatchSearch, CappedRun

    def fake_search(target, limit, kwargs, *, on_probe=None, **options):
        runs = [CappedRun(target, {**kwargs, "batch_size": b}, limit, b <= 64, b * 1000 if b <= 64 else None,
                          "", 0.1) for b in (32, 64, 128)]
        for run in runs:
            on_probe(run)
        return BatchSearch(64, limit, tuple(runs))

    monkeypatch.setattr(memgrad.profiler, "max_batch_size", fake_search)
    monkeypatch.setattr(cli_budget, "predict_budget_batch", lambda *a: (60, None))
    spec = type("Spec", (), {"source": "coupling", "width": 8})()
    for progress in (True, False):
        results = cli_budget.find_budget_batches(spec, ["plain"], 2, [], 24 * 2**20, progress=progress)
        assert [r["batch_size"] for r in results] == [64]
        err = capsys.readouterr().err
        if progress:
            lines = err.strip().splitlines()
            assert lines[0] == "budget 24.00 MiB: plain: predicting the largest batch from traced steps"
            assert lines[-3:] == ["budget 24.00 MiB: plain, batch 32: fits", "budget 24.00 MiB: plain, batch 64: fits",
                                  "budget 24.00 MiB: plain, batch 128: out of memory"]
        else:
            assert err == ""
