"""Running untrusted code: namespaces, rlimits, an empty environment and a throwaway workdir.

See ``launcher.py`` for the process tree and isolation modes, ``runner.py`` for the async API.
"""

from .policy import DEFAULT_DENIED_PATHS, MODES, SandboxPolicy, default_python
from .probe import SandboxUnavailableError, probe_isolation
from .runner import SandboxRun, run_sandboxed

__all__ = ["DEFAULT_DENIED_PATHS", "MODES", "SandboxPolicy", "default_python", "SandboxUnavailableError",
           "probe_isolation", "SandboxRun", "run_sandboxed"]
