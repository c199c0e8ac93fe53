"""The model zoo's figures (docs/zoo.md), measured: training on the bundled digits and memory sweeps.

1. Glow (the seed's Table 1, on digits): the same multi-scale Glow trained with plain backprop
   and with the constant-memory stack, same seed; test bits/dim of each.
2. RevNet-38 vs ResNet-32 (equal size, the RevNet paper's pairing): test accuracy on digits.
3. Training-step peak memory vs depth: DenseNet-BC efficient vs plain, one Glow level
   reversible vs plain (each configuration in a fresh process, as the tests measure it).

Writes ``<out>/zoo_results.json``, ``<out>/zoo_memory.png`` and ``<out>/glow_digits_samples.png``
and prints markdown tables. Nothing downloads.

Usage:
  python scripts/zoo_results.py                  # everything (about 15 minutes on 2 CPU cores)
  python scripts/zoo_results.py --skip-training  # the memory sweeps only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DENSENET_DEPTHS = (16, 40, 70, 100)
GLOW_STEPS = (4, 8, 16, 32)
MiB = 2**20


def glow_comparison(epochs, steps, hidden, lr, samples_path):
    import keras

    from memgrad_zoo import data
    from memgrad_zoo.glow import Glow
    from memgrad_zoo.train import save_sample_grid, train_glow

    digits = data.load_digits()
    results = {}
    for reversible in (True, False):
        keras.utils.set_random_seed(0)
        glow = Glow((8, 8, 1), levels=2, steps=steps, hidden=hidden, reversible=reversible, seed=0)
        results["reversible" if reversible else "plain"] = train_glow(glow, digits, epochs, 64, lr, verbose=0)
        print(f"glow reversible={reversible}: {results['reversible' if reversible else 'plain']}", flush=True)
        if reversible:
            save_sample_grid(glow, samples_path)
    results["config"] = dict(levels=2, steps=steps, hidden=hidden, epochs=epochs, lr=lr, batch_size=64)
    return results


def classifier_comparison(epochs, lr):
    import keras

    from memgrad_zoo import data, resnet, revnet
    from memgrad_zoo.train import train_classifier

    digits = data.load_digits()
    results = {}
    for name, build in (("RevNet-38", lambda: revnet.revnet(38, input_shape=(8, 8, 1))),
                        ("ResNet-32", lambda: resnet.resnet(32, input_shape=(8, 8, 1)))):
        keras.utils.set_random_seed(0)
        results[name] = train_classifier(build(), digits, epochs, 64, lr, verbose=0)
        print(f"{name}: {results[name]}", flush=True)
    return results


def memory_sweeps():
    """Peaks per configuration from tests/models/memory_probe.py, the two sweeps in parallel."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_ENABLE_ONEDNN_OPTS="1", TF_CPU_ALLOCATOR_USE_BFC="true")
    sweeps = {
        "densenet": ",".join(f"{d}:{e}" for d in DENSENET_DEPTHS for e in (1, 0)),
        "glow": ",".join(f"{k}:{r}" for k in GLOW_STEPS for r in (1, 0)),
    }
    running = {kind: subprocess.Popen([sys.executable, "-W", "ignore", "-m", "tests.models.memory_probe",
                                       kind, configs], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
               for kind, configs in sweeps.items()}
    peaks = {}
    for kind, process in running.items():
        out, _ = process.communicate()
        if process.returncode:
            raise SystemExit(f"memory probe {kind} failed with exit {process.returncode}")
        peaks[kind] = {key: value / MiB for key, value in json.loads(out.split("PEAKS ", 1)[1]).items()}
    return peaks


def plot_memory(peaks, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for efficient, label in ((0, "plain"), (1, "efficient (recompute concat-BN-ReLU)")):
        left.plot(DENSENET_DEPTHS, [peaks["densenet"][f"{d}:{efficient}"] for d in DENSENET_DEPTHS],
                  "o-", label=label)
    left.set(title="DenseNet-BC (k=12), batch 8 of 16x16x3", xlabel="depth",
             ylabel="training-step peak (MiB above baseline)")
    for reversible, label in ((0, "plain backprop"), (1, "reversible (constant memory)")):
        right.plot(GLOW_STEPS, [peaks["glow"][f"{k}:{reversible}"] for k in GLOW_STEPS], "o-", label=label)
    right.set(title="One Glow level, batch 64 of 16x16x3", xlabel="flow steps K", ylabel="MiB above baseline")
    for axis in (left, right):
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def markdown(results):
    lines = []
    if "glow" in results:
        glow = results["glow"]
        config = glow["config"]
        lines += [f"Glow on digits (L={config['levels']}, K={config['steps']}, hidden {config['hidden']}, "
                  f"{config['epochs']} epochs, same seed):", "",
                  "| gradients | test bits/dim | train seconds |", "| --- | --- | --- |"]
        for key in ("plain", "reversible"):
            lines.append(f"| {key} | {glow[key]['test_bits_per_dim']:.4f} | {glow[key]['train_seconds']:.0f} |")
        lines.append("")
    if "classifiers" in results:
        lines += ["| model | parameters | digits test accuracy | train seconds |", "| --- | --- | --- | --- |"]
        for name, r in results["classifiers"].items():
            lines.append(f"| {name} | {r['parameters']:,} | {r['test_accuracy']:.4f} | {r['train_seconds']:.0f} |")
        lines.append("")
    if "memory" in results:
        densenet, glow = results["memory"]["densenet"], results["memory"]["glow"]
        lines += ["| DenseNet-BC depth | efficient MiB | plain MiB | ratio |", "| --- | --- | --- | --- |"]
        for d in DENSENET_DEPTHS:
            e, p = densenet[f"{d}:1"], densenet[f"{d}:0"]
            lines.append(f"| {d} | {e:.1f} | {p:.1f} | {e / p:.2f} |")
        lines += ["", "| Glow level K | reversible MiB | plain MiB | ratio |", "| --- | --- | --- | --- |"]
        for k in GLOW_STEPS:
            r, p = glow[f"{k}:1"], glow[f"{k}:0"]
            lines.append(f"| {k} | {r:.1f} | {p:.1f} | {r / p:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"), help="output directory (default docs/)")
    parser.add_argument("--skip-training", action="store_true", help="memory sweeps only")
    parser.add_argument("--skip-memory", action="store_true", help="training comparisons only")
    parser.add_argument("--glow-epochs", type=int, default=40)
    parser.add_argument("--glow-steps", type=int, default=8)
    parser.add_argument("--glow-hidden", type=int, default=64)
    parser.add_argument("--glow-lr", type=float, default=2e-3)
    parser.add_argument("--classifier-epochs", type=int, default=30)
    parser.add_argument("--classifier-lr", type=float, default=2e-3)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "zoo_results.json")
    results = {}
    if os.path.exists(path):  # keep the parts this run skips
        with open(path, encoding="utf-8") as handle:
            results = json.load(handle)
    if not args.skip_memory:
        results["memory"] = memory_sweeps()
        plot_memory(results["memory"], os.path.join(args.out, "zoo_memory.png"))
    if not args.skip_training:
        results["glow"] = glow_comparison(args.glow_epochs, args.glow_steps, args.glow_hidden, args.glow_lr,
                                          os.path.join(args.out, "glow_digits_samples.png"))
        results["classifiers"] = classifier_comparison(args.classifier_epochs, args.classifier_lr)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
