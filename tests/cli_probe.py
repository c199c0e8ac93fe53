"""Runs `memgrad-profile` in a fresh process: its exit status and outputs (a test probe).

`run(DIR, arguments)` (called in a fresh process by tests/test_cli.py) runs the command with DIR
as the working directory and returns ``status``, ``stdout``, ``stderr`` and the parsed
``memgrad-profile.json`` (``None`` if it was not written). By hand:
``python -m tests.cli_probe DIR [memgrad-profile arguments]`` prints that as ``CLI {json}``.
"""

import json
import os
import subprocess
import sys

def run(directory, arguments=(), env=None):
    os.makedirs(directory, exist_ok=True)
    unset = {"TF_CPU_ALLOCATOR_USE_BFC", "TF_CPP_MIN_LOG_LEVEL"}  # as a user runs it
    if (env or {}).get("TF_CPU_BFC_MEM_LIMIT_IN_MB"):
        # Under a cap the command chooses oneDNN itself (off, since a oneDNN kernel crashes the
        # process when an allocation fails); a CI pass that sets TF_ENABLE_ONEDNN_OPTS to pick
        # the kernels of the uncapped runs would otherwise overrule it.
        unset.add("TF_ENABLE_ONEDNN_OPTS")
    env = {**{k: v for k, v in os.environ.items() if k not in unset}, **(env or {})}
    done = subprocess.run([sys.executable, "-m", "memgrad_profile", *arguments], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=1200)
    path = os.path.join(directory, "memgrad-profile.json")
    result = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None
    return {"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-4000:], "json": result}


if __name__ == "__main__":
    print("CLI " + json.dumps(run(sys.argv[1], sys.argv[2:])), flush=True)
