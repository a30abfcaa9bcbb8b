"""Reward configuration: the CRD's evaluator entries, service settings, errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft_runtime.rewards import ConfigError, api_key_env_name, load_reward_config, parse_reward_config


def test_single_entry_at_top_level_like_the_crd() -> None:
    cfg = parse_reward_config({"builtin": "math", "timeoutSeconds": 12, "onError": "exclude", "remote": True})
    assert [(e.name, e.kind, e.builtin, e.weight) for e in cfg.evaluators] == [("math", "builtin", "math", 1.0)]
    assert (cfg.timeout_seconds, cfg.on_error, cfg.concurrency) == (12.0, "exclude", 16)
    assert cfg.evaluators[0].timeout_seconds is None


def test_list_with_every_kind(tmp_path: Path) -> None:
    cfg = parse_reward_config({
        "evaluators": [
            {"builtin": "regex", "config": {"pattern": "x"}, "weight": 0.5, "timeoutSeconds": 3},
            {"entrypoint": "pkg.mod:grade"},
            {"bundle": {"image": "img:1", "entrypoint": "pkg.other:score"}},
            {"file": "/etc/eval.py", "function": "judge"},
            {"file": {"configMapKeyRef": {"name": "my-evals", "key": "eval.py"}}},
        ],
        "concurrency": 4, "filesDir": str(tmp_path),
    })
    e = cfg.evaluators
    assert [x.name for x in e] == ["regex", "grade", "score_1", "judge", "score_2"]
    assert (e[0].weight, e[0].timeout_seconds, e[0].config) == (0.5, 3.0, {"pattern": "x"})
    assert e[1].entrypoint == "pkg.mod:grade" and e[2].entrypoint == "pkg.other:score"
    assert (e[3].path, e[3].function) == ("/etc/eval.py", "judge")
    assert e[4].path == str(tmp_path / "4" / "eval.py")  # the operator mounts <index>/<key>
    assert cfg.concurrency == 4


def test_api_key_secret_ref_becomes_an_env_var_name() -> None:
    cfg = parse_reward_config({"evaluators": [{"builtin": "math"}, {
        "builtin": "llm_judge", "name": "judge-a", "apiKeySecretRef": {"name": "s", "key": "k"},
        "config": {"endpoint": "http://j", "model": "m"}}]})
    assert cfg.evaluators[1].config["apiKeyEnv"] == "RFT_EVALUATOR_1_API_KEY" == api_key_env_name(1)


RUNTIME_CONFIG = {
    "apiVersion": "rft.dev/v1alpha1", "kind": "RFTRuntimeConfig",
    "spec": {
        "evaluator": {
            "evaluators": [
                {"builtin": "math", "weight": 1.0},
                {"file": {"configMapKeyRef": {"name": "evals", "key": "style.py"}, "function": "style"}, "weight": 0.5},
                {"builtin": "llm_judge", "apiKeySecretRef": {"name": "judge", "key": "token"},
                 "config": {"endpoint": "http://judge:8000", "model": "m"}, "weight": 1.0},
            ],
            "timeoutSeconds": 45.0, "onError": "exclude", "remote": True,
        },
        "rollout": {"concurrency": 12},
    },
    "paths": {"evaluatorFiles": [{"index": 1, "path": "/etc/rft/evaluator/1/style.py", "function": "style"}]},
    "secretEnv": [{"index": 2, "env": "RFT_EVALUATOR_2_API_KEY"}],
}


def test_operator_runtime_config_is_accepted() -> None:
    cfg = parse_reward_config(RUNTIME_CONFIG)
    math_e, file_e, judge_e = cfg.evaluators
    assert (file_e.kind, file_e.path, file_e.function, file_e.name) == ("file", "/etc/rft/evaluator/1/style.py",
                                                                         "style", "style")
    assert judge_e.config["apiKeyEnv"] == "RFT_EVALUATOR_2_API_KEY"
    assert (cfg.timeout_seconds, cfg.on_error, cfg.concurrency) == (45.0, "exclude", 12)


def test_runtime_config_with_a_file_evaluator_but_no_path_is_refused() -> None:
    broken = {**RUNTIME_CONFIG, "paths": {"evaluatorFiles": []}}
    with pytest.raises(ConfigError, match="evaluator 1 is a file evaluator"):
        parse_reward_config(broken)


def test_config_json_built_by_the_operator() -> None:
    """Contract check against the operator's real builder (skipped while it is not importable)."""
    try:
        from rft_api.job import parse_manifest
        from rft_operator.builders.common import BuildContext
        from rft_operator.builders.config import runtime_config
    except ImportError as exc:
        pytest.skip(f"operator builders not importable: {exc}")
    job = parse_manifest({
        "apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": "judge-job", "namespace": "ns"},
        "spec": {"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                 "evaluator": {"evaluators": [
                     {"builtin": "math"},
                     {"builtin": "llm_judge", "apiKeySecretRef": {"name": "judge", "key": "token"},
                      "config": {"endpoint": "http://judge:8000", "model": "m"}},
                     {"builtin": "code_sandbox", "weight": 2}],
                     "timeoutSeconds": 40}},
    })
    cfg = parse_reward_config(runtime_config(job, BuildContext()))
    assert [e.name for e in cfg.evaluators] == ["math", "llm_judge", "code_sandbox"]
    assert [e.weight for e in cfg.evaluators] == [1.0, 1.0, 2.0]
    assert cfg.evaluators[1].config["apiKeyEnv"] == api_key_env_name(1)
    assert cfg.timeout_seconds == 40.0


@pytest.mark.parametrize("raw, message", [
    ({"evaluators": [{"builtin": "maths"}]}, r"evaluators\[0\]: field 'builtin' is 'maths'; known: code_sandbox, "
                                               r"llm_judge, math, regex, string_check"),
    ({"evaluators": [{"builtin": "math", "entrypoint": "a:b"}]}, "exactly one of"),
    ({"evaluators": [{"builtin": "math", "wieght": 2}]}, r"unknown field\(s\) wieght"),
    ({"evaluators": [{"builtin": "math", "weight": -1}]}, "'weight' must be >= 0"),
    ({"evaluators": [{"builtin": "math", "weight": 0}]}, "weight above 0"),
    ({"evaluators": []}, "non-empty list"),
    ({"evaluators": [{"builtin": "math"}], "concurency": 3}, r"unknown field\(s\) concurency"),
    ({"evaluators": [{"builtin": "math"}], "onError": "ignore"}, "onError.*zero, exclude"),
    ({"evaluators": [{"builtin": "math", "name": "a"}, {"builtin": "regex", "name": "a", "config": {"pattern": "x"}}]},
     "name.*a used more than once"),
    ({"evaluators": [{"file": {"configMapKeyRef": {"name": "x"}}}]}, "'file' must be"),
    ([1, 2], "must be an object"),
])
def test_bad_configs_name_the_field(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_reward_config(raw)


def test_load_yaml_and_json_files(tmp_path: Path) -> None:
    y = tmp_path / "reward.yaml"
    y.write_text("evaluators:\n  - builtin: string_check\n    config: {operation: eq}\ntimeoutSeconds: 7\n")
    assert load_reward_config(str(y)).timeout_seconds == 7.0
    j = tmp_path / "reward.json"
    j.write_text('{"builtin": "math", "concurrency": 2}')
    assert load_reward_config(str(j)).concurrency == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("evaluators: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_reward_config(str(bad))
    with pytest.raises(ConfigError, match="No such file"):
        load_reward_config(str(tmp_path / "missing.yaml"))
