"""``python -m memgrad.cli``: the same as the ``memgrad-profile`` command."""

import sys

from memgrad.cli.profile import main

if __name__ == "__main__":
    sys.exit(main())
