"""Reward configuration: the CRD's ``spec.evaluator`` (one typed shape), resolved through the runtime
contract, with errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft_api.job import parse_manifest
from rft_operator.builders.common import BuildContext
from rft_operator.builders.config import runtime_config
from rft_runtime.rewards import ConfigError, api_key_env_name, from_runtime_config, from_spec, load_reward_config
from rft_runtime.rewards.config import evaluator_names


def test_single_entry_at_top_level_like_the_crd() -> None:
    cfg = from_spec({"builtin": "math", "timeoutSeconds": 12, "onError": "exclude", "remote": True})
    assert [(e.name, e.kind, e.builtin, e.weight) for e in cfg.evaluators] == [("math", "builtin", "math", 1.0)]
    assert (cfg.timeout_seconds, cfg.on_error, cfg.concurrency) == (12.0, "exclude", 16)
    assert cfg.evaluators[0].timeout_seconds == 12.0  # the single form: its timeout is the entry's


def test_list_with_every_kind() -> None:
    cfg = from_spec({
        "evaluators": [
            {"builtin": "regex", "config": {"pattern": "x"}, "weight": 0.5, "timeoutSeconds": 3},
            {"bundle": {"image": "img:1", "entrypoint": "pkg.other:score"}},
            {"file": {"configMapKeyRef": {"name": "my-evals", "key": "eval.py"}, "function": "judge"}},
            {"file": {"configMapKeyRef": {"name": "my-evals", "key": "other.py"}}},
        ]}, files={2: "/mnt/2/eval.py", 3: "/mnt/3/other.py"}, concurrency=4)
    e = cfg.evaluators
    assert [x.name for x in e] == ["regex", "score_1", "judge", "score_2"]
    assert (e[0].weight, e[0].timeout_seconds, e[0].config) == (0.5, 3.0, {"pattern": "x"})
    assert e[1].entrypoint == "pkg.other:score"
    assert (e[2].path, e[2].function) == ("/mnt/2/eval.py", "judge")
    assert cfg.concurrency == 4
    assert evaluator_names({"evaluators": [{"builtin": "math"}, {"builtin": "math"}]}) == ["math_1", "math_2"]


def test_api_key_secret_ref_becomes_an_env_var_name() -> None:
    cfg = from_spec({"evaluators": [{"builtin": "math"}, {
        "builtin": "llm_judge", "name": "judge-a", "apiKeySecretRef": {"name": "s", "key": "k"},
        "config": {"endpoint": "http://j", "model": "m"}}]})
    assert cfg.evaluators[1].config["apiKeyEnv"] == "RFT_EVALUATOR_1_API_KEY" == api_key_env_name(1)


def _job(evaluator: dict, **spec_over: object):
    spec = {"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
            "evaluator": evaluator, **spec_over}
    return parse_manifest({"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob",
                           "metadata": {"name": "judge-job", "namespace": "ns"}, "spec": spec})


def test_operator_runtime_config_resolves_files_and_keys(tmp_path: Path) -> None:
    job = _job({"evaluators": [
        {"builtin": "math", "weight": 1.0},
        {"file": {"configMapKeyRef": {"name": "evals", "key": "style.py"}, "function": "style"}, "weight": 0.5},
        {"builtin": "llm_judge", "apiKeySecretRef": {"name": "judge", "key": "token"},
         "config": {"endpoint": "http://judge:8000", "model": "m"}, "weight": 1.0}],
        "timeoutSeconds": 45.0, "onError": "exclude", "remote": True}, rollout={"concurrency": 12})
    cfg = runtime_config(job, BuildContext())
    reward = from_runtime_config(cfg)
    math_e, file_e, judge_e = reward.evaluators
    assert (file_e.kind, file_e.path, file_e.function, file_e.name) == ("file", "/etc/rft/evaluator/1/style.py",
                                                                         "style", "style")
    assert judge_e.config["apiKeyEnv"] == "RFT_EVALUATOR_2_API_KEY"
    assert (reward.timeout_seconds, reward.on_error, reward.concurrency) == (45.0, "exclude", 12)
    (tmp_path / "config.json").write_text(cfg.to_json())  # `rft reward --config` reads the same file
    assert [e.name for e in load_reward_config(str(tmp_path / "config.json")).evaluators] == [
        "math", "style", "llm_judge"]


def test_a_file_evaluator_without_a_mounted_path_is_refused() -> None:
    with pytest.raises(ConfigError, match="evaluator 0 is a file evaluator"):
        from_spec({"file": {"configMapKeyRef": {"name": "x", "key": "e.py"}}})


@pytest.mark.parametrize("raw, message", [
    ({"evaluators": [{"builtin": "maths"}]}, r"spec\.evaluator\.evaluators\.0\.builtin"),
    ({"evaluators": [{"builtin": "math", "bundle": {"image": "i", "entrypoint": "a:b"}}]}, "exactly one of"),
    ({"evaluators": [{"builtin": "math", "wieght": 2}]}, r"evaluators\.0\.wieght: Extra inputs"),
    ({"evaluators": [{"builtin": "math", "weight": -1}]}, r"weight: Input should be greater than or equal to 0"),
    ({"evaluators": [{"builtin": "math", "weight": 0}]}, "weight above 0"),
    ({"evaluators": []}, "at least 1 item"),
    ({"builtin": "math", "onError": "ignore"}, r"onError: Input should be 'zero' or 'exclude'"),
    ({"evaluators": [{"builtin": "math", "name": "a"}, {"builtin": "regex", "name": "a", "config": {"pattern": "x"}}]},
     "name.*a used more than once"),
    ([1, 2], "must be an object"),
])
def test_bad_configs_name_the_field(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_spec(raw)  # type: ignore[arg-type]


def test_load_refuses_what_is_not_a_runtime_config(tmp_path: Path) -> None:
    bad = tmp_path / "reward.json"
    bad.write_text('{"builtin": "math"}')
    with pytest.raises(ConfigError, match="job: Field required"):
        load_reward_config(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_reward_config(str(tmp_path / "missing.json"))
