"""Test harness run inside the sandbox (standalone: stdlib only, placed read-only at /.rft).

Two processes, so that the untrusted solution can neither forge the verdict nor read the tests::

    H  python -I -B /.rft/_rft_harness.py tests|io   trusted: holds fd 3 (the verdict channel)
    └─ S  python -I -B /.rft/_rft_harness.py host R W   untrusted: runs solution.py, answers calls
       (io mode: S is ``python -I -B solution.py`` itself, on the case's stdin)

* **Verdict.** Only H writes fd 3, one JSON line ``{"kind": "result", "status": "syntax_error" |
  "error" | "completed" | "tests", ...}``. S is started without fd 3 (``close_fds``), and H makes
  itself non-dumpable before S starts, so S (same uid, no capabilities) cannot open
  ``/proc/<H>/fd/3``, read or write H's memory (``/proc/<H>/mem``, ``process_vm_*``, ``ptrace`` all
  need ptrace access, which a non-dumpable target refuses to a caller without CAP_SYS_PTRACE).
* **Tests.** The tests reach H on its stdin and never touch the filesystem; H reads them before S
  exists. Each test block runs in H; the solution's names are proxies: calling one sends the
  arguments to S and brings back the result as plain data (None, bool, int, float, complex, str,
  bytes and lists/tuples/sets/dicts of them, exact types only), so comparisons happen in H on
  values the solution cannot overload (an object claiming to equal everything arrives as an opaque
  handle that equals nothing and has no truth value). S sees the arguments of its calls, as any
  solution does, never the expected values.
* What S can still do: crash, hang, kill H, answer wrongly — each ends as a failure, never a pass.
"""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys

MAX_LINE = 16 << 20  # one encoded reply
MAX_ITEMS = 100_000  # items taken from an iterator the solution returns
MAX_DEPTH = 64


# ----------------------------------------------------------------------------- plain-data codec


class NotPlain(TypeError):
    """A value that is not plain data (it crosses as a handle, or not at all)."""


def encode(x: object, handles: list | None, depth: int = 0) -> list:
    t = type(x)
    if x is None:
        return ["n"]
    if t is bool:
        return ["b", x]
    if t is int:
        return ["i", str(x)]
    if t is float:
        return ["f", repr(x)]
    if t is complex:
        return ["c", repr(x.real), repr(x.imag)]  # type: ignore[attr-defined]
    if t is str:
        return ["s", x]
    if t is bytes:
        return ["y", x.hex()]  # type: ignore[attr-defined]
    if depth < MAX_DEPTH:
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}.get(t)  # type: ignore[call-overload]
        if tag is not None:
            return [tag, [encode(v, handles, depth + 1) for v in x]]  # type: ignore[attr-defined]
        if t is dict:
            return ["d", [[encode(k, handles, depth + 1), encode(v, handles, depth + 1)]
                          for k, v in x.items()]]  # type: ignore[attr-defined]
        # Subclasses of plain types (Counter, OrderedDict, namedtuple, an int subclass) cross as
        # their base value, read with the base type's own methods: overrides of __eq__, __iter__,
        # items() or __repr__ never run on the trusted side and cannot change what is compared.
        for base, read in _BASES:
            if isinstance(x, base):
                return encode(read(x), handles, depth + 1)  # type: ignore[arg-type]
    ref = getattr(x, "_rft_handle", None) if handles is None else None
    if isinstance(ref, int):
        return ["h", ref]
    if handles is None:
        raise NotPlain(f"{t.__name__} cannot be passed to the solution (plain data only)")
    handles.append(x)
    return ["h", len(handles) - 1]


_BASES = (
    (bool, bool.__bool__), (int, int.__int__), (float, float.__float__), (str, str.__str__),
    (bytes, lambda b: bytes(memoryview(b))), (dict, lambda d: dict(dict.items(d))),
    (list, lambda v: list(list.__iter__(v))), (tuple, lambda v: tuple(tuple.__iter__(v))),
    (frozenset, lambda v: frozenset(frozenset.__iter__(v))), (set, lambda v: set(set.__iter__(v))),
)


def decode(v: list, handle: object) -> object:
    tag = v[0]
    if tag == "n":
        return None
    if tag == "b":
        return bool(v[1])
    if tag == "i":
        return int(v[1])
    if tag == "f":
        return float(v[1])
    if tag == "c":
        return complex(float(v[1]), float(v[2]))
    if tag == "s":
        return str(v[1])
    if tag == "y":
        return bytes.fromhex(v[1])
    if tag == "l":
        return [decode(e, handle) for e in v[1]]
    if tag == "t":
        return tuple(decode(e, handle) for e in v[1])
    if tag == "S":
        return {decode(e, handle) for e in v[1]}
    if tag == "F":
        return frozenset(decode(e, handle) for e in v[1])
    if tag == "d":
        return {decode(k, handle): decode(e, handle) for k, e in v[1]}
    if tag == "h":
        return handle(int(v[1]))  # type: ignore[operator]
    raise ValueError(f"unknown tag {tag!r}")


def describe(exc: BaseException) -> dict:
    return {"exc_type": type(exc).__name__, "message": str(exc)[:500]}


# ----------------------------------------------------------------------------- S: the solution's host


def host(rfd: int, wfd: int) -> None:
    """Runs solution.py, then answers H's calls until H closes the pipe."""
    me = os.getpid()
    rd = os.fdopen(rfd, "rb")

    def reply(obj: dict) -> None:
        if os.getpid() != me:  # a forked copy of the solution stays silent
            os._exit(1)
        os.write(wfd, (json.dumps(obj) + "\n").encode())

    handles: list = []
    with open("solution.py") as fh:
        source = fh.read()
    ns: dict = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(source, "solution.py", "exec"), ns)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            reply({"error": {"exc_type": "SystemExit", "message": str(exc.code)}})
            return
    except BaseException as exc:  # noqa: BLE001 - everything is reported
        if isinstance(exc, MemoryError):
            ns.clear()
            handles.clear()
        reply({"error": describe(exc)})
        return
    names = {k: v for k, v in ns.items() if not k.startswith("__")}
    reply({"names": {k: encode(v, handles) for k, v in names.items()}})

    def arg(v: list) -> object:
        return decode(v, lambda i: handles[i])

    while True:
        line = rd.readline()
        if not line:  # H is done: keep what the solution printed, then go
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(0)
        try:
            req = json.loads(line)
            target = handles[req["h"]]
            op = req["op"]
            if op == "get":
                out = getattr(target, req["name"])
            elif op == "call":
                out = target(*[arg(a) for a in req["args"]], **{k: arg(a) for k, a in req["kwargs"]})
            elif op == "getitem":
                out = target[arg(req["args"][0])]
            elif op == "len":
                out = len(target)
            elif op == "contains":
                out = arg(req["args"][0]) in target
            elif op == "iter":
                out = []
                for i, item in enumerate(target):
                    if i >= MAX_ITEMS:
                        break
                    out.append(item)
            else:
                raise ValueError(f"unknown op {op!r}")
            reply({"v": encode(out, handles)})
        except BaseException as exc:  # noqa: BLE001 - handed to the test as an exception
            if isinstance(exc, MemoryError):
                handles.clear()
            reply({"raise": describe(exc)})


# ----------------------------------------------------------------------------- H: the trusted side


class SolutionError(Exception):
    """The solution raised something that is not a builtin exception, or its process ended."""


def _no_dump() -> None:
    """PR_SET_DUMPABLE 0: no process of our uid without CAP_SYS_PTRACE may read or write our
    memory or open our file descriptors through /proc."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def emit(**obj: object) -> None:
    os.write(3, (json.dumps(obj) + "\n").encode())


class Link:
    """H's end of the pipes to S."""

    def __init__(self, proc: subprocess.Popen, wfd: int, rfd: int) -> None:
        self.proc, self.w, self.r = proc, os.fdopen(wfd, "wb"), os.fdopen(rfd, "rb")

    def read(self) -> dict:
        line = self.r.readline(MAX_LINE + 1)
        if not line or not line.endswith(b"\n"):
            code = self.proc.poll()
            if code is None and line:
                raise SolutionError("the solution's reply is too large")
            code = self.proc.wait() if code is None else code
            raise SolutionError(f"the solution's process ended (exit code {code})", code)
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise SolutionError("malformed reply from the solution")
        return obj

    def call(self, op: str, h: int, **kw: object) -> object:
        req = {"op": op, "h": h, **kw}
        try:
            self.w.write((json.dumps(req) + "\n").encode())
            self.w.flush()
        except OSError:
            raise SolutionError("the solution's process ended") from None
        rep = self.read()
        if "raise" in rep:
            info = rep["raise"]
            name, msg = str(info.get("exc_type")), str(info.get("message"))
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
                try:
                    raise cls(msg)
                except TypeError:  # an exception class with another constructor
                    pass
            raise SolutionError(f"{name}: {msg}")
        return self.value(rep.get("v"))

    def value(self, v: object) -> object:
        if not isinstance(v, list) or not v:
            raise SolutionError("malformed reply from the solution")
        return decode(v, lambda i: Remote(self, i))


class Remote:
    """A solution object that is not plain data: usable only through S."""

    __slots__ = ("_rft_link", "_rft_handle")
    __hash__ = object.__hash__
    _rft_link: Link
    _rft_handle: int

    def __init__(self, link: Link, h: int) -> None:
        object.__setattr__(self, "_rft_link", link)
        object.__setattr__(self, "_rft_handle", h)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._rft_link.call("get", self._rft_handle, name=name)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._rft_link.call("call", self._rft_handle, args=[encode(a, None) for a in args],
                                   kwargs=[[k, encode(v, None)] for k, v in kwargs.items()])

    def __getitem__(self, key: object) -> object:
        return self._rft_link.call("getitem", self._rft_handle, args=[encode(key, None)])

    def __len__(self) -> int:
        n = self._rft_link.call("len", self._rft_handle)
        if type(n) is not int:
            raise TypeError("len() of a solution object must be an int")
        return n

    def __contains__(self, item: object) -> bool:
        return self._rft_link.call("contains", self._rft_handle, args=[encode(item, None)]) is True

    def __iter__(self):  # type: ignore[no-untyped-def]
        out = self._rft_link.call("iter", self._rft_handle)
        return iter(out if isinstance(out, list) else [])

    def __eq__(self, other: object) -> bool:
        return self is other

    def __bool__(self) -> bool:
        raise TypeError("a solution object that is not plain data has no truth value in a test")

    def __repr__(self) -> str:
        return f"<solution object #{self._rft_handle}>"


def run_tests(source: str, tests: list) -> None:
    r1, w1 = os.pipe()  # H → S
    r2, w2 = os.pipe()  # S → H
    proc = subprocess.Popen([sys.executable, "-I", "-B", __file__, "host", str(r1), str(w2)],
                            pass_fds=(r1, w2), stdin=subprocess.DEVNULL, close_fds=True)
    os.close(r1)
    os.close(w2)
    link = Link(proc, w1, r2)
    try:
        first = link.read()
    except SolutionError as exc:
        code = exc.args[1] if len(exc.args) > 1 else None
        signal = -code if isinstance(code, int) and code < 0 else None
        emit(kind="result", status="error", stage="solution", exc_type="exit",
             message=f"the solution's process ended (exit code {code})", signal=signal)
        return
    if "error" in first:
        info = first["error"] if isinstance(first["error"], dict) else {}
        emit(kind="result", status="error", stage="solution", exc_type=str(info.get("exc_type")),
             message=str(info.get("message"))[:500])
        return
    names = first.get("names")
    if not isinstance(names, dict):
        emit(kind="result", status="error", stage="solution", exc_type="ProtocolError",
             message="the solution's process answered something other than its names")
        return
    passed, failures, errors = 0, [], []
    for i, block in enumerate(tests):
        try:
            scope = {"__name__": "__rft_test__", "__builtins__": builtins}
            scope.update({str(k): link.value(v) for k, v in names.items()})
            exec(compile(block, f"test_{i}.py", "exec"), scope)
        except AssertionError as exc:
            failures.append({"index": i, "message": str(exc)[:300]})
        except BaseException as exc:  # noqa: BLE001
            errors.append({"index": i, **describe(exc)})
        else:
            passed += 1
    emit(kind="result", status="tests", passed=passed, total=len(tests), failures=failures[:5], errors=errors[:5])
    link.w.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_io() -> None:
    proc = subprocess.Popen([sys.executable, "-I", "-B", "solution.py"], close_fds=True)
    code = proc.wait()
    if code == 0:
        emit(kind="result", status="completed")
    else:
        emit(kind="result", status="error", stage="solution", exc_type="exit",
             message=f"exited with code {code}", signal=-code if code < 0 else None)


def main() -> None:
    mode = sys.argv[1]
    if mode == "host":
        host(int(sys.argv[2]), int(sys.argv[3]))
        return
    os.set_inheritable(3, False)
    _no_dump()
    tests = json.loads(sys.stdin.read()).get("tests", []) if mode == "tests" else []
    with open("solution.py") as fh:
        source = fh.read()
    try:
        compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        emit(kind="result", status="syntax_error", **describe(exc), line=getattr(exc, "lineno", None))
        return
    if mode == "io":
        run_io()
    else:
        run_tests(source, tests)


if __name__ == "__main__":
    main()
