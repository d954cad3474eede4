"""The ``isorun`` command of the Python package: the C++ command shipped inside it."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Replaces this process with the bundled ``isorun`` program, passing the arguments on."""
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "isorun")
    if not os.access(program, os.X_OK):
        sys.exit(f"isorun: the bundled command is missing ({program}); reinstall the package")
    os.execv(program, [program, *sys.argv[1:]])


if __name__ == "__main__":
    main()
