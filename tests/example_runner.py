"""The fresh-process target that runs one documentation example (tests/test_docs_examples.py)."""

import contextlib
import io
import runpy
import sys
import traceback

from tests.zoo_checkout import ROOT, import_zoo_from_this_checkout


def run_example(directory, path):
    """Runs the script at ``path`` as ``__main__``, ``directory`` first on ``sys.path`` as for a
    script, this checkout's ``models/`` imported as memgrad_zoo; returns what it printed.

    Raises:
      RuntimeError: the example's traceback, then what it printed before it failed.
    """
    import_zoo_from_this_checkout()
    sys.path.insert(0, directory)
    sys.argv[:] = [path]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            runpy.run_path(path, run_name="__main__")
    except BaseException as error:  # noqa: BLE001 - SystemExit too: an example must not exit
        raise RuntimeError("".join(traceback.format_exception(error))[-6000:]
                           + "\n--- stdout\n" + printed.getvalue()[-3000:]) from None
    imported = sys.modules.get("memgrad")
    assert imported is None or imported.__file__.startswith(ROOT), imported.__file__
    return printed.getvalue()
