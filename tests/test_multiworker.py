"""`MultiWorkerMirroredStrategy` with two worker processes on localhost (a real TF_CONFIG
cluster): one training step of a checkpointed model and of a reversible model moves every
weight by the same step on both workers as one process without a strategy
(tests/multiworker_worker.py; a custom loop, since Keras 3's `fit` fails under this strategy
for any model, keras-team/keras#20585)."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 240


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _start(out, tf_config=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="-1")
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return subprocess.Popen([sys.executable, "-m", "tests.multiworker_worker", str(out)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_workers_match_one_process(tmp_path):
    workers = [f"localhost:{port}" for port in _free_ports(2)]
    processes = [_start(tmp_path / f"worker{i}.npz",
                        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
                 for i in range(2)]
    processes.append(_start(tmp_path / "single.npz"))
    try:
        outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in processes]
    finally:
        for p in processes:
            p.kill()
    for p, output in zip(processes, outputs):
        assert p.returncode == 0, output[-3000:]
    single = np.load(tmp_path / "single.npz")
    start_keys = sorted(single.files)
    assert {k.split("/")[0] for k in start_keys} == {"checkpointed", "reversible"}
    for i in range(2):
        worker = np.load(tmp_path / f"worker{i}.npz")
        assert sorted(worker.files) == start_keys
        for model in ("checkpointed", "reversible"):
            keys = [k for k in start_keys if k.startswith(model + "/")]
            scale = max(np.abs(single[k]).max() for k in keys)
            assert scale > 1e-4, f"{model}: the step moved no weight"
            error = max(np.abs(worker[k] - single[k]).max() for k in keys) / scale
            assert error <= 1e-5, f"worker {i}, {model}: relative error {error:.2e}"
