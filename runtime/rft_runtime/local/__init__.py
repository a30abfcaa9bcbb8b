"""`rft run`: an RFTJob manifest on this machine, its roles as Ray actors (see :mod:`.runner`)."""

from .runner import LocalRunError, RunOptions, RunResult, run_local

__all__ = ["LocalRunError", "RunOptions", "RunResult", "run_local"]
