"""Runs `memgrad-profile` in a fresh process and prints its exit status and outputs (a test probe).

Usage: ``python -m tests.cli_probe DIR [memgrad-profile arguments]``: runs the command with DIR as
the working directory and prints ``CLI {json}`` with ``status``, ``stdout``, ``stderr`` and the
parsed ``memgrad-profile.json`` (``None`` if it was not written).
"""

import json
import os
import subprocess
import sys

if __name__ == "__main__":
    directory, arguments = sys.argv[1], sys.argv[2:]
    os.makedirs(directory, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}  # as a user runs it
    done = subprocess.run([sys.executable, "-m", "memgrad.cli", *arguments], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=1200)
    path = os.path.join(directory, "memgrad-profile.json")
    result = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None
    print("CLI " + json.dumps({"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-4000:],
                               "json": result}), flush=True)
