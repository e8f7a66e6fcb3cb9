"""What the calibration command lines share: a bad input ends in one line on stderr and exit status 2."""

from __future__ import annotations

import sys
from typing import NoReturn


def fail(prog: str, message: str) -> NoReturn:
    """Print ``prog: error: message`` (whitespace folded to one line) to stderr and exit with status 2."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)
