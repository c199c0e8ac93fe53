"""The ``memgrad-profile`` command's launcher: sets TensorFlow's environment, then runs it.

TensorFlow reads two variables once, early: ``TF_CPP_MIN_LOG_LEVEL`` when it logs first (while it
is imported) and ``TF_CPU_ALLOCATOR_USE_BFC`` when it starts its devices. ``memgrad.cli`` is
part of the ``memgrad`` package, whose import imports TensorFlow, so the command's entry point
is this module, which imports nothing before setting them. Values the user set are kept.
``python -m memgrad_profile ...`` is the same as ``memgrad-profile ...``.
"""

import os
import sys


def main(argv=None) -> int:
    """Runs ``memgrad-profile`` (``memgrad.cli.main``) with TensorFlow's start-up logs off.

    Args:
      argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
      The command's exit status.
    """
    # Level 3 hides TensorFlow's C++ start-up lines (CUDA probing, CPU features); the command
    # reports its own errors in one line each.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    with _native_stderr_silenced():  # lines TensorFlow's C++ side writes while it loads
        from memgrad.cli import main as run

    return run(argv)


class _native_stderr_silenced:
    """Points file descriptor 2 at /dev/null for the block (Python's own errors still raise)."""

    def __enter__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        return False


if __name__ == "__main__":
    sys.exit(main())
