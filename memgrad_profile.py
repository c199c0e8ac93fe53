"""The ``memgrad-profile`` command's launcher: sets TensorFlow's environment, then runs it.

TensorFlow reads these variables once, early: ``TF_CPP_MIN_LOG_LEVEL`` when it logs first and
``TF_ENABLE_ONEDNN_OPTS`` while it is imported, ``TF_CPU_ALLOCATOR_USE_BFC`` when it starts its
devices. ``memgrad.cli`` is
part of the ``memgrad`` package, whose import imports TensorFlow, so the command's entry point
is this module, which imports nothing before setting them. Values the user set are kept.
``python -m memgrad_profile ...`` is the same as ``memgrad-profile ...``.

``--help`` is answered without importing TensorFlow at all: the parser's module
(``memgrad/cli/arguments.py``, standard library only) is loaded by its path, since importing
it as ``memgrad.cli.arguments`` would import the ``memgrad`` package first.
"""

import importlib.util
import os
import sys

CAP_VARIABLE = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"


def main(argv=None) -> int:
    """Runs ``memgrad-profile`` (``memgrad.cli.main``) with TensorFlow's start-up logs off.

    Args:
      argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
      The command's exit status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        _arguments().build_parser().parse_args(argv)  # prints the help, exits 0
    # Level 3 hides TensorFlow's C++ start-up lines (CUDA probing, CPU features); the command
    # reports its own errors in one line each.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    if os.environ.get(CAP_VARIABLE):
        # Under an allocator cap (an emulated small device) a oneDNN kernel whose allocation fails
        # crashes the process (segfault, TF 2.21) instead of raising ResourceExhaustedError, so
        # the run cannot report the OOM. TensorFlow's own kernels raise it.
        os.environ.setdefault(ONEDNN_VARIABLE, "0")
    with _native_stderr_silenced():  # lines TensorFlow's C++ side writes while it loads
        from memgrad.cli import main as run

    return run(argv)


def _arguments():
    """``memgrad/cli/arguments.py`` as a module, loaded by its path: its package's
    ``__init__`` (which imports TensorFlow) is not run."""
    package = importlib.util.find_spec("memgrad")  # located, not imported
    path = os.path.join(os.path.dirname(package.origin), "cli", "arguments.py")
    spec = importlib.util.spec_from_file_location("memgrad_profile_arguments", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
