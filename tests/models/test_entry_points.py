"""The zoo's training entry points: help, one-line argument errors, a run that saves a checkpoint."""

import json
import os
import subprocess
import sys

import keras
import pytest

from memgrad_zoo.glow import Glow  # registered: load_model finds the class
from memgrad_zoo.train import classifier_main, glow_main


MAINS = {
    "revnet": lambda argv: classifier_main("revnet", argv),
    "resnet": lambda argv: classifier_main("resnet", argv),
    "densenet": lambda argv: classifier_main("densenet", argv),
    "glow": glow_main,
}


@pytest.mark.parametrize("kind", sorted(MAINS))
def test_help_exits_zero(kind, capsys):
    with pytest.raises(SystemExit) as exit_info:
        MAINS[kind](["--help"])
    assert exit_info.value.code == 0
    assert f"usage: memgrad-zoo {kind}" in capsys.readouterr().out


@pytest.mark.parametrize("kind, argv, message", [
    ("revnet", ["--depth", "40"], "RevNet depth must be"),
    ("resnet", ["--epochs", "0"], "--epochs must be positive. Received: 0"),
    ("densenet", ["--depth", "41"], "DenseNet-BC depth"),
    ("glow", ["--levels", "4"], "multiples of 16"),
    ("glow", ["--data", "cifar10"], "needs --cifar10-path DIR"),
    ("glow", ["--data", "mnist"], "invalid choice: 'mnist'"),
])
def test_bad_arguments_give_one_line_and_exit_2(kind, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        MAINS[kind](argv + ["--quiet"])
    assert exit_info.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and message in error_lines[0], error_lines


@pytest.mark.slow
def test_classifier_run_saves_a_loadable_checkpoint_and_a_summary(tmp_path):
    checkpoint, summary = tmp_path / "revnet.keras", tmp_path / "revnet.json"
    classifier_main("revnet", ["--depth", "14", "--epochs", "1", "--quiet",
                               "--output", str(checkpoint), "--summary", str(summary)])
    results = json.loads(summary.read_text())
    assert results["checkpoint"] == str(checkpoint)
    assert 0.0 <= results["test_accuracy"] <= 1.0
    assert keras.saving.load_model(checkpoint).count_params() == results["parameters"]


@pytest.mark.slow
def test_python_dash_m_memgrad_zoo_glow_trains_with_a_progress_bar_and_writes_samples(tmp_path):
    """``python -m memgrad_zoo glow`` from another folder: the installed zoo, not the repository's."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "memgrad_zoo", "glow", "--levels", "1", "--steps", "1",
         "--hidden", "8", "--epochs", "1", "--output", str(tmp_path / "glow.keras"),
         "--samples", str(tmp_path / "samples.png"), "--summary", str(tmp_path / "glow.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "23/23" in done.stdout  # Keras's progress bar: 1437 digits in batches of 64
    assert "done: model=glow" in done.stdout
    results = json.loads((tmp_path / "glow.json").read_text())
    assert 0 < results["test_bits_per_dim"] < 8
    assert (tmp_path / "samples.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = keras.saving.load_model(tmp_path / "glow.keras")
    assert isinstance(loaded, Glow) and loaded.steps == 1
    assert int(loaded.optimizer.iterations.numpy()) == 23  # compiled as saved, state loaded


def test_memgrad_zoo_without_a_model_names_the_choices(capsys):
    from memgrad_zoo.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["mnist"])
    assert exit_info.value.code == 2
    assert "expected a model in revnet, resnet, densenet, glow. Received: 'mnist'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["revnet", "glow"])
def test_training_traces_the_step_once(kind):
    """The model, its optimizer and its metrics are built before `fit`: variables made while
    Keras traces the first step would make TensorFlow trace it twice."""
    from memgrad_zoo import data, glow, revnet
    from memgrad_zoo.train import train_classifier, train_glow

    (x, y), (x_test, y_test) = data.load_digits()
    digits = ((x[:64], y[:64]), (x_test[:32], y_test[:32]))
    if kind == "revnet":
        model, train = revnet.revnet(14, input_shape=(8, 8, 1)), train_classifier
    else:
        model, train = glow.Glow((8, 8, 1), levels=1, steps=2, hidden=8), train_glow
    traces = []
    train_step = model.train_step

    def counted(data):
        traces.append(1)
        return train_step(data)

    model.train_step = counted
    result = train(model, digits, epochs=1, batch_size=32, lr=1e-3, verbose=0)
    assert len(traces) == 1
    assert result["train_seconds"] > 0
