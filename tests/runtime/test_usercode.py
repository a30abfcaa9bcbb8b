"""The shared loader of user Python code (rft_runtime.usercode), with real files and modules."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rft_runtime import usercode
from rft_runtime.rewards import ConfigError, load_function
from rft_runtime.rollout import BundleError, load_bundle
from rft_runtime.usercode import (
    Reference,
    UserCodeError,
    get_attribute,
    import_module,
    is_coroutine_callable,
    load_file,
    load_module,
    module_name_for,
    parse_reference,
    resolve,
    takes_positional,
)

SOURCE = textwrap.dedent(
    """
    LOADS = [1]

    def score(sample, item):
        return 1.0

    async def rollout(task, client):
        return None

    class Grader:
        class Inner:
            @staticmethod
            def score(sample, item):
                return 0.25

        @property
        def broken(self):
            raise RuntimeError("property bug")

    grader = Grader()
    """
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """Each test gets its own sys.path copy, and modules it loaded are dropped afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_code.py"
    path.write_text(SOURCE)
    return path


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch) -> str:
    pkg = tmp_path / "modroot" / "rft_uc_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(SOURCE)
    (pkg / "explodes.py").write_text("raise RuntimeError('import-time bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "modroot"))
    return "rft_uc_pkg.mod"


@pytest.mark.parametrize(
    "ref, target, attribute, is_file",
    [
        ("pkg.mod", "pkg.mod", None, False),
        ("pkg.mod:score", "pkg.mod", "score", False),
        ("pkg.mod:Grader.score", "pkg.mod", "Grader.score", False),
        ("/x/y.py", "/x/y.py", None, True),
        ("  /x/y.py:grade  ", "/x/y.py", "grade", True),
        ("y.py", "y.py", None, True),
        ("/etc/rft/evaluator/0/bundle", "/etc/rft/evaluator/0/bundle", None, True),  # ConfigMap key
        ("/etc/rft/evaluator/0/bundle:Bundle", "/etc/rft/evaluator/0/bundle", "Bundle", True),
        ("/odd:dir/y.py", "/odd:dir/y.py", None, True),  # a non-name after ':' is part of the path
    ],
)
def test_parse_reference_forms(ref, target, attribute, is_file):
    parsed = parse_reference(ref)
    assert (parsed.target, parsed.attribute, parsed.is_file) == (target, attribute, is_file)
    assert parsed.text == ref.strip()
    assert parsed.kind == ("file" if is_file else "module")


@pytest.mark.parametrize(
    "ref, match",
    [
        ("", "must be a non-empty string"),
        ("   ", "must be a non-empty string"),
        (None, "must be a non-empty string"),
        ("not a module!", "neither a module name"),
        ("pkg..mod:score", "neither a module name"),
        ("pkg-mod", "neither a module name"),
    ],
)
def test_parse_reference_rejects_malformed(ref, match):
    with pytest.raises(UserCodeError, match=match) as info:
        parse_reference(ref)
    assert info.value.reference == (ref.strip() if isinstance(ref, str) and ref.strip() else ref)
    assert isinstance(info.value, ValueError)


def test_what_word_names_the_kind_of_code():
    with pytest.raises(UserCodeError, match="the evaluator reference must be"):
        parse_reference("", what="evaluator")
    with pytest.raises(UserCodeError, match="cannot import evaluator module 'rft_uc_no_such_mod'"):
        import_module("rft_uc_no_such_mod", what="evaluator")
    with pytest.raises(UserCodeError, match=r"^'rft_uc_no_such_mod:x': cannot import module 'rft_uc_no_such_mod'"):
        load_module("rft_uc_no_such_mod:x")


def test_same_file_loaded_twice_is_one_module(user_file: Path, monkeypatch):
    first = load_file(str(user_file))
    first.LOADS.append(2)  # state survives: the file is not executed again
    assert load_file(str(user_file)) is first
    monkeypatch.chdir(user_file.parent)
    assert load_file("user_code.py") is first  # a relative path to the same file
    assert first.__name__ == module_name_for(str(user_file)) == module_name_for("user_code.py")
    assert first.__name__.startswith(usercode.MODULE_PREFIX)
    assert sys.modules[first.__name__] is first and first.LOADS == [1, 2]
    other = user_file.parent / "other.py"
    other.write_text(SOURCE)
    assert load_file(str(other)) is not first and module_name_for(str(other)) != first.__name__


def test_configmap_key_without_py_suffix(tmp_path: Path):
    key = tmp_path / "configmap" / "eval"  # a ConfigMap key mounted as a file has no suffix
    key.parent.mkdir()
    key.write_text(SOURCE)
    parsed, module, obj = resolve(f"{key}:Grader.Inner.score")
    assert parsed.is_file and parsed.target == str(key)
    assert obj(None, None) == 0.25 and module.score(None, None) == 1.0


def test_folder_is_appended_for_sibling_helpers(tmp_path: Path):
    (tmp_path / "rft_uc_helper.py").write_text("VALUE = 41\n")
    main = tmp_path / "main"
    main.write_text("import rft_uc_helper\n\ndef score(sample, item):\n    return rft_uc_helper.VALUE + 1\n")
    assert str(tmp_path) not in sys.path
    module = load_file(str(main))
    assert module.score(None, None) == 42
    assert sys.path[-1] == str(tmp_path)
    load_file(str(main))
    assert sys.path.count(str(tmp_path)) == 1


def test_missing_file(tmp_path: Path):
    missing = tmp_path / "nope.py"
    with pytest.raises(UserCodeError, match=f"file {missing} does not exist") as info:
        load_file(str(missing), reference=f"{missing}:score")
    assert info.value.reference == f"{missing}:score"
    with pytest.raises(UserCodeError, match="does not exist"):
        load_file(str(tmp_path))  # a folder is not a file


def test_file_that_raises_on_import_is_not_cached(tmp_path: Path):
    path = tmp_path / "bad.py"
    path.write_text("raise RuntimeError('import-time bug')\n")
    with pytest.raises(UserCodeError, match=r"bad.py failed to load: RuntimeError: import-time bug") as info:
        load_file(str(path))
    assert isinstance(info.value.__cause__, RuntimeError)
    assert module_name_for(str(path)) not in sys.modules
    path.write_text("def score(sample, item):\n    return 1\n")  # fixed: the next load executes it
    assert load_file(str(path)).score(None, None) == 1


def test_syntax_error_and_system_exit(tmp_path: Path):
    broken = tmp_path / "broken.py"
    broken.write_text("def score(sample, item):\n  return (\n")
    with pytest.raises(UserCodeError, match="SyntaxError"):
        load_file(str(broken))
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(SystemExit):
        load_file(str(exits))
    assert module_name_for(str(exits)) not in sys.modules


def test_module_references(user_package: str):
    _, module, obj = resolve(f"{user_package}:Grader.Inner.score")
    assert module.__name__ == user_package and obj(None, None) == 0.25
    _, _, default = resolve(user_package, default="score")
    assert default is module.score
    _, _, whole = resolve(user_package)
    assert whole is module
    with pytest.raises(UserCodeError, match="cannot import module 'rft_uc_pkg.absent'"):
        import_module("rft_uc_pkg.absent")
    with pytest.raises(UserCodeError, match="importing module 'rft_uc_pkg.explodes' failed: RuntimeError: import-time bug"):
        import_module("rft_uc_pkg.explodes")


def test_dotted_attributes_and_their_errors(user_file: Path):
    ref = f"{user_file}:Grader.Inner.missing"
    with pytest.raises(UserCodeError, match=r"'.*user_code.py:Grader.Inner' has no attribute 'missing'") as info:
        resolve(ref)
    assert info.value.reference == ref
    with pytest.raises(UserCodeError, match=r"'.*user_code.py' has no attribute 'Nope'"):
        resolve(f"{user_file}:Nope.score")
    module = load_file(str(user_file))
    with pytest.raises(UserCodeError, match="reading 'broken' from 'grader' failed: RuntimeError: property bug"):
        get_attribute(module.grader, "broken", reference="r", owner="grader")
    with pytest.raises(UserCodeError, match="not a dotted Python name"):
        get_attribute(module, "Grader..Inner", reference="r")
    assert get_attribute(module, "grader.Inner.score", reference="r")(None, None) == 0.25


def test_reference_object_is_accepted(user_file: Path):
    parsed = Reference(text=f"{user_file}:score", target=str(user_file), attribute="score", is_file=True)
    assert resolve(parsed)[2](None, None) == 1.0


def test_signature_and_async_helpers(user_file: Path):
    module = load_file(str(user_file))
    assert takes_positional(module.score, 2) and not takes_positional(module.score, 3)
    assert not takes_positional(lambda a: a, 2)
    assert takes_positional(len, 1)
    assert is_coroutine_callable(module.rollout) and not is_coroutine_callable(module.score)

    class AsyncCallable:
        async def __call__(self, sample, item):
            return 1.0

    assert is_coroutine_callable(AsyncCallable()) and not is_coroutine_callable(None)


def test_callers_share_modules_and_keep_their_error_types(tmp_path: Path):
    key = tmp_path / "shared"  # one ConfigMap key used as a reward evaluator and as a bundle
    key.write_text(SOURCE)
    fn = load_function(path=str(key), function="Grader.Inner.score")
    bundle = load_bundle(f"{key}")
    assert fn.__module__ == bundle.score.__module__ == module_name_for(str(key))
    assert bundle.rollout_is_async and fn(None, None) == 0.25
    bad = tmp_path / "bad.py"
    bad.write_text("raise KeyError('x')\n")
    with pytest.raises(ConfigError, match=r"evaluator file .*bad.py failed to load: KeyError"):
        load_function(str(bad))
    with pytest.raises(BundleError, match=r"^bundle '.*bad.py': file .*bad.py failed to load: KeyError"):
        load_bundle(str(bad))
    with pytest.raises(BundleError, match="must be a single name"):
        load_bundle(f"{key}:Grader.Inner")
