"""Custom evaluators (module / file, sync / async), composites, timeouts and the onError policy."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rft_runtime.rewards import (
    CompositeEvaluator,
    ConfigError,
    CustomEvaluator,
    EvaluatorError,
    Item,
    Sample,
    ScoreResult,
    Slot,
    build_composite,
    load_function,
)
from rft_runtime.rewards.config import from_spec
from rft_runtime.rewards.custom import parse_reference

EVAL_SOURCE = textwrap.dedent('''
    import asyncio

    def score(sample, item):
        return 1.0 if sample.text.strip() == str(item.ground_truth) else 0.0

    async def ascore(sample, item):
        await asyncio.sleep(0)
        return {"reward": 0.5, "reason": "async half", "metrics": {"length": len(sample["text"])}}

    def not_applicable(sample, item):
        return None

    def boom(sample, item):
        raise RuntimeError("evaluator bug")

    def wrong_type(sample, item):
        return "high"

    def one_arg(sample):
        return 1.0

    class Grader:
        @staticmethod
        def score(sample, item):
            return True

    grader = Grader()
''')


@pytest.fixture
def eval_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_eval.py"
    path.write_text(EVAL_SOURCE)
    return path


@pytest.fixture
def eval_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = tmp_path / "modroot" / "user_rewards"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "scoring.py").write_text(EVAL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path / "modroot"))
    yield "user_rewards.scoring"
    for name in [m for m in sys.modules if m.startswith("user_rewards")]:
        del sys.modules[name]


def test_parse_reference_forms() -> None:
    assert parse_reference("pkg.mod:score") == ("module", "pkg.mod", "score")
    assert parse_reference("file:/x/y.py:grade") == ("file", "/x/y.py", "grade")
    assert parse_reference("/x/y.py") == ("file", "/x/y.py", "score")
    assert parse_reference("pkg.mod:Grader.score") == ("module", "pkg.mod", "Grader.score")
    with pytest.raises(ConfigError):
        parse_reference("not a module!")


async def test_load_from_module_and_file(eval_module: str, eval_file: Path) -> None:
    fn = load_function(f"{eval_module}:score")
    assert fn(Sample(text="7"), Item(ground_truth=7)) == 1.0
    afn = load_function(f"file:{eval_file}:ascore")
    assert (await afn(Sample(text="abc"), Item()))["metrics"] == {"length": 3}
    assert load_function(path=str(eval_file), function="Grader.score")(Sample(), Item()) is True
    assert load_function(f"{eval_file}:grader")(Sample(), Item()) is True  # object with .score
    assert load_function(str(eval_file))(Sample(text="1"), Item(ground_truth="1")) == 1.0


def test_load_errors_are_clear(eval_module: str, eval_file: Path) -> None:
    with pytest.raises(ConfigError, match="cannot import evaluator module 'no_such_mod'"):
        load_function("no_such_mod:score")
    with pytest.raises(ConfigError, match="has no attribute 'missing'"):
        load_function(f"{eval_module}:missing")
    with pytest.raises(ConfigError, match="two positional arguments"):
        load_function(f"{eval_file}:one_arg")
    with pytest.raises(ConfigError, match="does not exist"):
        load_function("/nonexistent/eval.py:score")


def slot(name: str, fn, weight: float = 1.0, timeout: float = 5.0) -> Slot:  # type: ignore[no-untyped-def]
    return Slot(name, CustomEvaluator(fn, name), weight, timeout)


async def test_weighted_mean_skips_none_and_keeps_per_evaluator_metrics() -> None:
    comp = CompositeEvaluator([
        slot("a", lambda s, i: 1.0, weight=3.0),
        slot("b", lambda s, i: ScoreResult(0.0, "nope", {"len": 2}), weight=1.0),
        slot("c", lambda s, i: None, weight=5.0),
        slot("logged", lambda s, i: 0.25, weight=0.0),
    ])
    r = await comp.score(Sample(text="x"), Item())
    await comp.aclose()
    assert r.reward == pytest.approx(0.75)  # (3*1 + 1*0) / 4; c is n/a, weight 0 only logged
    assert r.metrics == {"a": 1.0, "b": 0.0, "b/len": 2.0, "logged": 0.25}
    assert r.error is None and "[c=n/a]" in r.reason and "[b=0] nope" in r.reason


async def test_all_none_gives_none() -> None:
    comp = CompositeEvaluator([slot("a", lambda s, i: None), slot("b", lambda s, i: None)])
    assert (await comp.score(Sample(), Item())).reward is None
    await comp.aclose()


@pytest.mark.parametrize("on_error, expected", [("zero", 1.0 / 6), ("exclude", 1.0)])
async def test_timeouts_and_errors_follow_on_error(on_error: str, expected: float) -> None:
    release = threading.Event()

    async def slow_async(s, i):  # type: ignore[no-untyped-def]
        await asyncio.sleep(30)

    def slow_sync(s, i):  # type: ignore[no-untyped-def]
        release.wait(30)
        return 1.0

    def parse_fail(s, i):  # type: ignore[no-untyped-def]
        raise EvaluatorError("parse_error", "judge said nothing")

    comp = CompositeEvaluator([
        slot("ok", lambda s, i: 1.0),
        slot("slow_async", slow_async, timeout=0.2),
        slot("slow_sync", slow_sync, timeout=0.2),
        slot("crash", lambda s, i: 1 / 0),
        slot("bad_type", lambda s, i: "high"),
        slot("parse", parse_fail),
    ], on_error=on_error)  # type: ignore[arg-type]
    started = time.monotonic()
    parts = await comp.score_all(Sample(), Item())
    elapsed = time.monotonic() - started
    release.set()
    await comp.aclose()
    assert elapsed < 10  # the abandoned sync call did not hold the sample (a bound, not a speed check)
    assert parts["slow_async"].error == "timeout" and parts["slow_sync"].error == "timeout"
    assert parts["crash"].error == "runtime_error" and "ZeroDivisionError" in parts["crash"].reason
    assert parts["bad_type"].error == "runtime_error" and "invalid result" in parts["bad_type"].reason
    assert parts["parse"].error == "parse_error"
    failed_reward = 0.0 if on_error == "zero" else None
    assert all(parts[n].reward == failed_reward for n in ("slow_async", "slow_sync", "crash", "bad_type", "parse"))
    combined = comp.combine(parts)
    assert combined.reward == pytest.approx(expected)  # zero: 1 of 6 scored 1.0; exclude: only "ok" counts
    assert combined.error == "timeout"  # the first error, in evaluator order
    assert combined.metrics["slow_sync/error_timeout"] == 1.0 and combined.metrics["crash/error_runtime_error"] == 1.0


async def test_returned_error_flags_are_kept_as_returned() -> None:
    comp = CompositeEvaluator([slot("m", lambda s, i: ScoreResult(0.0, "no answer", error="parse_error"))],
                              on_error="exclude")
    r = await comp.score(Sample(), Item())
    await comp.aclose()
    assert (r.reward, r.error) == (0.0, "parse_error")  # a verdict about the sample, not a failure


async def test_build_composite_from_config(eval_module: str, eval_file: Path, tmp_path: Path) -> None:
    module_file = tmp_path / "modroot" / "user_rewards" / "scoring.py"
    comp = build_composite(from_spec({
        "evaluators": [
            {"builtin": "math", "weight": 2.0},
            {"file": {"configMapKeyRef": {"name": "cm", "key": "scoring.py"}, "function": "score"}, "weight": 1.0,
             "name": "exact"},
            {"file": {"configMapKeyRef": {"name": "cm", "key": eval_file.name}, "function": "ascore"},
             "weight": 1.0, "timeoutSeconds": 2},
            {"bundle": {"image": "x", "entrypoint": f"{eval_module}:not_applicable"}},
        ],
        "timeoutSeconds": 5, "onError": "exclude",
    }, files={1: str(module_file), 2: str(eval_file)}))
    assert comp.names == ["math", "exact", "ascore", "not_applicable"]
    assert [s.timeout_seconds for s in comp.slots] == [5, 5, 2, 5]
    r = await comp.score(Sample(text="#### 12"), Item(ground_truth="12"))
    await comp.aclose()
    # math: "#### 12" → 1.0 (w2); exact: "#### 12" != "12" → 0.0 (w1); ascore 0.5 (w1); n/a skipped
    assert r.reward == pytest.approx((2 * 1.0 + 0.0 + 0.5) / 4)
    assert r.metrics["ascore/length"] == 7.0 and "not_applicable" not in r.metrics


async def test_evaluators_with_domains_score_only_their_tasks():
    """``evaluators[].domains`` routes: an evaluator is not called for another domain's task, and the
    combined reward is the mean over those that apply."""
    calls: list[str] = []

    class Named:
        def __init__(self, name: str, reward: float) -> None:
            self.name, self.reward = name, reward

        def score(self, sample, item):
            calls.append(self.name)
            return self.reward

    comp = CompositeEvaluator([Slot("arith", Named("arith", 1.0), domains=frozenset({"arithmetic"})),
                               Slot("code", Named("code", 0.25), domains=frozenset({"code"})),
                               Slot("length", Named("length", 0.5))])
    arith = await comp.score(Sample(text="4"), Item(domain="arithmetic"))
    assert arith.reward == pytest.approx(0.75) and set(arith.metrics) == {"arith", "length"}
    assert sorted(calls) == ["arith", "length"]
    calls.clear()
    group = await comp.score_group([Sample(text="a"), Sample(text="b")], Item(domain="code"))
    assert [r.reward for r in group] == [pytest.approx(0.375)] * 2 and sorted(calls) == ["code", "code", "length", "length"]
    calls.clear()
    other = await comp.score(Sample(text="x"), Item(domain="poetry"))
    assert other.reward == 0.5 and calls == ["length"]
    await comp.aclose()


def test_evaluator_domains_come_from_the_spec():
    cfg = from_spec({"evaluators": [{"name": "a", "builtin": "math", "domains": ["arithmetic", "words"]},
                                    {"name": "b", "builtin": "math"}]})
    assert [e.domains for e in cfg.evaluators] == [["arithmetic", "words"], None]
    comp = build_composite(cfg)
    assert [s.domains for s in comp.slots] == [frozenset({"arithmetic", "words"}), None]


@pytest.mark.parametrize("on_error, expected", [("zero", 0.25), ("exclude", 1.0)])
async def test_a_reward_outside_the_evaluators_range_is_refused_and_counted(on_error: str, expected: float) -> None:
    """A custom evaluator returning 1e300 (its group's advantages would overflow float32) is refused
    like one that raised; the default range is [-1e6, 1e6], a declared one replaces it."""

    class Grouped:
        grouped = True

        async def score_group(self, samples, item):
            return [2.0, 0.5]

    comp = CompositeEvaluator([slot("huge", lambda s, i: 1e300), slot("ok", lambda s, i: 1.0),
                               Slot("percent", CustomEvaluator(lambda s, i: 50.0, "percent"), reward_range=(0, 1)),
                               Slot("group", Grouped(), reward_range=(0.0, 1.0))], on_error=on_error)  # type: ignore[arg-type]
    assert comp.slots[0].reward_range == (-1e6, 1e6)
    r = await comp.score(Sample(text="x"), Item())
    assert r.error == "runtime_error"
    assert r.metrics["huge/reward_out_of_range"] == 1.0 and r.metrics["percent/reward_out_of_range"] == 1.0
    assert "huge: reward 1e+300 is outside its rewardRange [-1e+06, 1e+06]" in r.reason
    assert "percent: reward 50 is outside its rewardRange [0, 1]" in r.reason
    group = await comp.score_group([Sample(text="a"), Sample(text="b")], Item())
    await comp.aclose()
    assert [g.metrics.get("group/reward_out_of_range") for g in group] == [1.0, None]
    assert group[1].metrics["group"] == 0.5
    # zero: the refused count as 0 in the weighted mean; exclude: they drop out of it (the groupwise
    # evaluator has no per-sample score: an error of its own for one sample)
    assert r.reward == pytest.approx(expected)


def test_reward_ranges_come_from_the_spec():
    cfg = from_spec({"evaluators": [{"name": "a", "builtin": "math", "rewardRange": {"min": -1, "max": 2}},
                                    {"name": "b", "builtin": "math"}]})
    assert [e.reward_range for e in cfg.evaluators] == [(-1.0, 2.0), (-1e6, 1e6)]
    assert [s.reward_range for s in build_composite(cfg).slots] == [(-1.0, 2.0), (-1e6, 1e6)]
