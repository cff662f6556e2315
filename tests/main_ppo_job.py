"""verl 0.9.1's ``python -m verl.trainer.main_ppo`` entry point, called in this process: with
Hydra's ``--cfg job`` among the arguments it composes the full config, prints it and returns before
Ray or any GPU work (one interpreter start-up instead of one per composition)."""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr, redirect_stdout


def main_ppo_job(args: list[str]) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``main_ppo`` run with ``args``; a bad override makes Hydra
    exit 1, which is returned rather than raised."""
    from verl.trainer import main_ppo

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv, code = [main_ppo.__file__, *args], 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main_ppo.main()
    except SystemExit as exit_:
        code = exit_.code
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()
