"""The ``calsweep`` command: the project's command lines under one name.

    calsweep launch [--config FILE] [KEY.SUB=VALUE ...]    run a sweep (sweeps.launch; also python sweeps/launch.py)
    calsweep analyze RESULTS [--filter ...] [--out DIR]    the paper's tables and figures from a store (sweeps.analyze)
    calsweep evaluate --model NAME [--tasks ...] [--ats]   score a model without SFT (trainable.evaluate)
    calsweep rescore SOURCE [--temperature fit] [...]      metrics again from stored log-likelihoods (calibration.rescore)

A subcommand takes exactly its entry point's arguments (``calsweep launch --help`` lists them); the exit status is
the entry point's (2 for a bad input, reported in one line).
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from common.config import suggest

COMMANDS = {  # name -> (module whose main(argv, prog) runs it, what it does)
    "launch": ("sweeps.launch", "run a label-smoothing calibration sweep (Ray Tune x DeepSpeed)"),
    "analyze": ("sweeps.analyze", "the paper's tables and figures from a results store"),
    "evaluate": ("trainable.evaluate", "score a model's calibration without SFT, optionally with an ATS head"),
    "rescore": ("calibration.rescore", "recompute metrics from stored log-likelihoods (no model)"),
}


def usage() -> str:
    """The command's help: one line per subcommand."""
    lines = [f"  {name:<9} {summary}" for name, (_, summary) in COMMANDS.items()]
    return "usage: calsweep {" + ",".join(COMMANDS) + "} ...\n\n" + "\n".join(lines) + \
        "\n\n`calsweep COMMAND --help` explains a command's options.\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``argv[0]``'s entry point with the rest of ``argv``; its exit status (0 when it returns a result)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage(), end="")
        return 0
    if not argv or argv[0] not in COMMANDS:
        got = repr(argv[0]) if argv else "nothing"
        print(f"calsweep: error: expected a command of {list(COMMANDS)}, got {got}"
              f"{suggest(argv[0], COMMANDS) if argv else ''}", file=sys.stderr)
        return 2
    module, _ = COMMANDS[argv[0]]
    result = importlib.import_module(module).main(argv[1:], prog=f"calsweep {argv[0]}")  # usage names calsweep
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
