"""memgrad's application layer: the ``memgrad-profile`` command.

It sits above everything else (it builds the zoo's models and applies every technique to
them); nothing in ``memgrad`` outside this package imports it.

- `memgrad.cli.arguments`: the parser (standard library only: ``--help`` needs no TensorFlow).
- `memgrad.cli.profile`: the run (``main``).
- `memgrad.cli.sweep`: builds a model per strategy and runs its training step.
- `memgrad.cli.report`: the table, the plot, budget lines and one-line errors.
"""

from memgrad.cli.profile import main

__all__ = ["main"]
