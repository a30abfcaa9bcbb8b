"""Loading the user's Python code: custom reward evaluators and evaluator bundles share this.

A reference is ``target`` or ``target:attribute``:

- ``target`` is a module name (``pkg.module``, imported normally) or a file path. A target that ends
  in ``.py`` or contains a path separator is a file, even without the suffix (a ConfigMap key
  mounted as a file).
- ``attribute`` is a dotted name (``score``, ``Grader.score``) walked from the module. Only the last
  ``:`` separates it, and only when what follows is a dotted name; otherwise the whole reference is
  the target.

A file is executed once per process as a module named ``rft_usercode_<hash of its absolute path>``
(so loading it again returns the same module object), and its folder is appended to ``sys.path`` so
that helper modules beside it can be imported. Every failure raises :class:`UserCodeError`, whose
message names the reference and the reason; callers re-raise it as their own error type.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "UserCodeError", "Reference", "parse_reference", "import_module", "load_file", "module_name_for",
    "load_module", "get_attribute", "resolve", "takes_positional", "is_coroutine_callable",
]

MODULE_PREFIX = "rft_usercode_"
_LOAD_LOCK = threading.RLock()  # one thread executes a given file; the others get the finished module


class UserCodeError(ValueError):
    """User code could not be loaded; ``reference`` is what the user wrote, ``reason`` why it failed."""

    def __init__(self, reference: Any, reason: str) -> None:
        self.reference = reference
        self.reason = reason
        super().__init__(f"{reference!r}: {reason}")


@dataclass(frozen=True)
class Reference:
    """A parsed reference: ``target`` (module name or file path) and the optional dotted ``attribute``."""

    text: str
    target: str
    attribute: str | None
    is_file: bool

    @property
    def kind(self) -> str:
        """``"file"`` or ``"module"``."""
        return "file" if self.is_file else "module"


def _is_dotted_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _noun(what: str, noun: str) -> str:
    return f"{what} {noun}" if what else noun


def parse_reference(ref: Any, *, what: str = "") -> Reference:
    """Split ``target[:attribute]`` and decide module vs file; raises UserCodeError when malformed.
    ``what`` names the kind of code in messages, as for :func:`import_module`."""
    if not isinstance(ref, str) or not ref.strip():
        raise UserCodeError(ref, f"the {_noun(what, 'reference')} must be a non-empty string like "
                                 "'pkg.module:name' or '/path/file.py:name'")
    text = ref.strip()
    head, sep, tail = text.rpartition(":")
    if sep and head and _is_dotted_name(tail):
        target, attribute = head, tail
    else:
        target, attribute = text, None
    is_file = target.endswith(".py") or os.sep in target or (os.altsep is not None and os.altsep in target)
    if not is_file and not _is_dotted_name(target):
        raise UserCodeError(text, f"{target!r} is neither a module name (pkg.module) nor a file path "
                                  "(ending in .py or containing a path separator)")
    return Reference(text=text, target=target, attribute=attribute, is_file=is_file)


def import_module(name: str, *, reference: Any = None, what: str = "") -> ModuleType:
    """``importlib.import_module(name)``; an ImportError becomes a UserCodeError.

    ``what`` is a word naming the kind of code in messages (``"evaluator"`` reads
    "cannot import evaluator module ..."). An exception raised while the module body runs is reported
    too, with its type.
    """
    ref = name if reference is None else reference
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise UserCodeError(ref, f"cannot import {_noun(what, 'module')} {name!r}: {exc}") from exc
    except Exception as exc:
        raise UserCodeError(ref, f"importing {_noun(what, 'module')} {name!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc


def module_name_for(path: str) -> str:
    """The stable ``sys.modules`` name a file is loaded under (a hash of its absolute path)."""
    return MODULE_PREFIX + hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:12]


def load_file(path: str, *, reference: Any = None, what: str = "") -> ModuleType:
    """Execute the Python file at ``path`` as a module, once per process (later calls return the same
    module). The suffix does not matter. Its folder is appended to ``sys.path`` for sibling helpers.
    A missing file or one that raises while executing gives a UserCodeError (and is not cached)."""
    full = os.path.abspath(path)
    ref = path if reference is None else reference
    file_noun = _noun(what, "file")
    if not os.path.isfile(full):
        raise UserCodeError(ref, f"{file_noun} {full} does not exist")
    name = module_name_for(full)
    with _LOAD_LOCK:
        if name in sys.modules:
            return sys.modules[name]
        loader = importlib.machinery.SourceFileLoader(name, full)
        spec = importlib.util.spec_from_file_location(name, full, loader=loader)
        if spec is None or spec.loader is None:  # pragma: no cover - an explicit loader always gives a spec
            raise UserCodeError(ref, f"{file_noun} {full} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        folder = os.path.dirname(full)
        if folder not in sys.path:
            sys.path.append(folder)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise UserCodeError(ref, f"{file_noun} {full} failed to load: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module


def load_module(ref: Reference | str, *, what: str = "") -> ModuleType:
    """The module a reference's target names: imported by name or loaded from its file."""
    parsed = ref if isinstance(ref, Reference) else parse_reference(ref, what=what)
    if parsed.is_file:
        return load_file(parsed.target, reference=parsed.text, what=what)
    return import_module(parsed.target, reference=parsed.text, what=what)


def get_attribute(obj: Any, dotted: str, *, reference: Any, owner: str | None = None) -> Any:
    """Walk ``dotted`` (``"Grader.score"``) from ``obj``; a missing part gives a UserCodeError naming
    ``owner`` (what ``obj`` is, for the message; default its ``__name__``) and the walked prefix."""
    if not isinstance(dotted, str) or not _is_dotted_name(dotted):
        raise UserCodeError(reference, f"{dotted!r} is not a dotted Python name")
    where = owner if owner is not None else str(getattr(obj, "__name__", type(obj).__name__))
    walked: list[str] = []
    for part in dotted.split("."):
        here = f"{where}:{'.'.join(walked)}" if walked else where
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserCodeError(reference, f"{here!r} has no attribute {part!r}") from None
        except Exception as exc:
            raise UserCodeError(reference, f"reading {part!r} from {here!r} failed: {type(exc).__name__}: {exc}") from exc
        walked.append(part)
    return obj


def resolve(ref: Reference | str, *, default: str | None = None, what: str = "") -> tuple[Reference, ModuleType, Any]:
    """Parse, load and walk a reference: ``(reference, module, object)``. Without an attribute in the
    reference, ``default`` is walked instead, or the module itself is the object when it is None."""
    parsed = ref if isinstance(ref, Reference) else parse_reference(ref, what=what)
    module = load_module(parsed, what=what)
    attribute = parsed.attribute if parsed.attribute is not None else default
    if attribute is None:
        return parsed, module, module
    return parsed, module, get_attribute(module, attribute, reference=parsed.text, owner=parsed.target)


def takes_positional(fn: Any, count: int) -> bool:
    """Whether ``fn`` can be called with ``count`` positional arguments (True when Python cannot
    tell, as for some builtins without a signature)."""
    try:
        inspect.signature(fn).bind(*([None] * count))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def is_coroutine_callable(fn: Any) -> bool:
    """True for an ``async def`` function or an object whose ``__call__`` is one."""
    return fn is not None and (inspect.iscoroutinefunction(fn)
                               or inspect.iscoroutinefunction(type(fn).__call__))
