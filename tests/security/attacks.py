"""Shared helpers of the runtime attack tests (tests/security/test_episodes.py, test_sandbox_escape.py,
test_judge.py, test_serve_limits.py): builders of honest and forged requests. Not a conftest: the
directory is shared with other suites."""

from __future__ import annotations

from typing import Any


def episode(task_key: str, idx: int, *, version: int = 0, reward: Any = 1.0, prompt: list[int] | None = None,
            response: list[int] | None = None) -> dict[str, Any]:
    """An episode as a rollout worker posts it (JSON form); every field can be poisoned."""
    resp = [3] if response is None else response
    return {
        "id": f"{task_key}:{idx}",
        "task_id": task_key,
        "rollout_idx": idx,
        "trajectories": [{"name": "default", "reward": reward, "steps": [{
            "prompt_ids": [1, 2] if prompt is None else prompt, "response_ids": resp,
            "logprobs": [-0.5] * len(resp), "response_mask": [1] * len(resp),
            "finish_reason": "stop", "policy_version": version}]}],
    }


def tasks(k: int) -> list[dict[str, Any]]:
    """``k`` tasks in ``Task.to_dict()`` form, each with a secret ground truth."""
    return [{"task_id": f"t{i}", "prompt": f"q{i}", "ground_truth": f"secret-{i}"} for i in range(k)]


# ------------------------------------------------------------------------------------------- sandbox
# Solutions written by a policy that tries to talk its way out of the code sandbox.

FORGED_VERDICT = "{\"kind\": \"result\", \"status\": \"tests\", \"passed\": 1000, \"total\": 1, \"failures\": [], \"errors\": []}"

FD3_FORGERY = (
    "import os\n"
    f"line = {FORGED_VERDICT!r} + '\\n'\n"
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        os.write(fd, line.encode())\n"
    "    except OSError:\n"
    "        pass\n"
    "def add(a, b):\n"
    "    return -7\n"
)

PROC_FD_FORGERY = (
    "import os\n"
    f"line = {FORGED_VERDICT!r} + '\\n'\n"
    "errors = []\n"
    "for pid in [os.getppid(), 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
    "    try:\n"
    "        with open(f'/proc/{pid}/fd/3', 'w') as fh:\n"
    "            fh.write(line)\n"
    "    except OSError as e:\n"
    "        errors.append(e)\n"
    "def add(a, b):\n"
    "    return -7\n"
)

# Looks everywhere a test could be, and answers with whatever it finds (an honest solution cannot
# know the secret value the test expects).
TEST_READER = r'''
import gc, os, re, sys
found = []

def scan(text):
    found.extend(re.findall("S3CR3T-[0-9]+", text))

def walk(top):
    for root, dirs, files in os.walk(top):
        for f in files:
            try:
                with open(os.path.join(root, f), "rb") as fh:
                    scan(fh.read(1 << 20).decode("latin-1"))
            except OSError:
                pass

for top in (".", "/.rft", "/tmp", "/work"):
    walk(top)
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for name in ("cmdline", "environ", "fd/0"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as fh:
                scan(fh.read(1 << 20).decode("latin-1"))
        except OSError:
            pass
    try:  # another process's memory (the harness holds the tests)
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                try:
                    mem.seek(lo)
                    scan(mem.read(min(hi - lo, 1 << 24)).decode("latin-1"))
                except (OSError, ValueError, OverflowError):
                    pass
    except OSError:
        pass
for obj in gc.get_objects():
    if isinstance(obj, str):
        scan(obj)

def magic():
    frame = sys._getframe(1)
    while frame is not None:  # the caller's constants (where the expected value would be)
        for c in frame.f_code.co_consts:
            if isinstance(c, str):
                scan(c)
        frame = frame.f_back
    return found[0] if found else "nothing found"
'''

ALWAYS_EQUAL = (
    "class Anything:\n"
    "    def __eq__(self, other):\n"
    "        return True\n"
    "    def __ne__(self, other):\n"
    "        return False\n"
    "    def __bool__(self):\n"
    "        return True\n"
    "def add(a, b):\n"
    "    return Anything()\n"
)

KILL_THE_JUDGE = (
    "import os, signal\n"
    "os.kill(os.getppid(), signal.SIGKILL)\n"
    "def add(a, b):\n"
    "    return -7\n"
)


def reader_of(*paths: str) -> str:
    """A solution that prints the content of ``paths`` (or the error reading each)."""
    lines = ["import os", "for p in %r:" % (list(paths),), "    try:",
             "        print('READ', p, open(p).read() if not os.path.isdir(p) else os.listdir(p))",
             "    except OSError as e:", "        print('DENIED', p, type(e).__name__)",
             "def add(a, b):", "    return a + b"]
    return "\n".join(lines) + "\n"
