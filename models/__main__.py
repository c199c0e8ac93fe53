"""``memgrad-zoo MODEL [options]`` (or ``python -m memgrad_zoo MODEL``): train a zoo model.

MODEL is one of ``revnet``, ``resnet``, ``densenet`` or ``glow``; ``memgrad-zoo MODEL --help``
lists its options.
"""

import sys

USAGE = "usage: memgrad-zoo {revnet,resnet,densenet,glow} [options]  (memgrad-zoo MODEL --help for options)"
KINDS = ("revnet", "resnet", "densenet", "glow")


def main(argv=None):
    """Dispatches to the chosen model's trainer.

    Args:
      argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
      None; exits with status 2 and a one-line message when MODEL is missing or unknown.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() if argv else USAGE, file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    kind, rest = argv[0], argv[1:]
    if kind not in KINDS:
        print(f"{USAGE}\nmemgrad-zoo: error: expected a model in {', '.join(KINDS)}. Received: {kind!r}",
              file=sys.stderr)
        raise SystemExit(2)
    from memgrad_zoo.train import classifier_main, glow_main

    if kind == "glow":
        glow_main(rest)
    else:
        classifier_main(kind, rest)


if __name__ == "__main__":
    main()
