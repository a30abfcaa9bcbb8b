"""Registries: exact keys, duplicates refused, unknown names listed, presets consistent."""

from __future__ import annotations

import pytest

from rft_runtime.algos import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHMS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    TIS_MODES,
    AlgorithmPreset,
    DuplicateRegistrationError,
    Registry,
    UnknownNameError,
    get_algorithm,
)

ALL = {
    "ADVANTAGE_ESTIMATORS": (ADVANTAGE_ESTIMATORS, {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"}),
    "POLICY_LOSSES": (POLICY_LOSSES, {"ppo_clip", "gspo", "cispo", "reinforce"}),
    "LOSS_AGGREGATIONS": (
        LOSS_AGGREGATIONS,
        {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"},
    ),
    "KL_ESTIMATORS": (KL_ESTIMATORS, {"k1", "k2", "k3"}),
    "TIS_MODES": (TIS_MODES, {"truncate", "mask"}),
    "ALGORITHMS": (ALGORITHMS, {"grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp"}),
}


@pytest.mark.parametrize("name", sorted(ALL))
def test_exact_keys(name: str) -> None:
    reg, keys = ALL[name]
    assert set(reg.names()) == keys
    assert len(reg) == len(keys)


@pytest.mark.parametrize("name", sorted(ALL))
def test_unknown_name_lists_known(name: str) -> None:
    reg, keys = ALL[name]
    with pytest.raises(UnknownNameError) as exc:
        reg.get("no-such-thing")
    msg = str(exc.value)
    assert "no-such-thing" in msg
    for k in keys:
        assert k in msg
    # usable both as ValueError (config) and KeyError (mapping)
    with pytest.raises(KeyError):
        reg["nope"]
    with pytest.raises(ValueError):
        reg["nope"]


@pytest.mark.parametrize("name", sorted(ALL))
def test_duplicate_refused(name: str) -> None:
    reg, keys = ALL[name]
    key = sorted(keys)[0]
    before = reg.get(key)
    with pytest.raises(DuplicateRegistrationError, match=key):
        reg.register(key, before)
    assert reg.get(key) is before
    assert set(reg.names()) == keys


def test_registry_decorator_and_types() -> None:
    reg: Registry = Registry("widget")

    @reg.register("a")
    def a() -> int:
        return 1

    assert reg.get("a") is a and "a" in reg and list(reg) == ["a"]
    with pytest.raises(DuplicateRegistrationError):

        @reg.register("a")
        def a2() -> int:
            return 2

    with pytest.raises(TypeError, match="callable"):
        reg.register("b", 3)
    with pytest.raises(TypeError, match="non-empty"):
        reg.register("", a)
    typed: Registry = Registry("preset", entry_type=AlgorithmPreset)
    with pytest.raises(TypeError, match="AlgorithmPreset"):
        typed.register("x", a)


@pytest.mark.parametrize("reg_name", ["ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "LOSS_AGGREGATIONS", "KL_ESTIMATORS", "TIS_MODES"])
def test_entries_document_shapes_and_equation(reg_name: str) -> None:
    reg, _ = ALL[reg_name]
    for key, fn in reg.items():
        doc = fn.__doc__ or ""
        assert "Shape" in doc, f"{reg_name}[{key}] docstring lacks shapes"
        assert "=" in doc, f"{reg_name}[{key}] docstring lacks its equation"


@pytest.mark.parametrize("name", sorted(ALL["ALGORITHMS"][1]))
def test_presets_refer_to_registered_entries(name: str) -> None:
    p = get_algorithm(name)
    assert p.name == name
    assert p.advantage_estimator in ADVANTAGE_ESTIMATORS
    assert p.policy_loss in POLICY_LOSSES
    assert p.loss_aggregation in LOSS_AGGREGATIONS
    assert p.group_relative and p.min_samples_per_prompt == 2
    cfg = p.policy_loss_config()
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip_c) == (p.clip_low, p.clip_high, p.dual_clip_c)
    assert p.reference


def test_preset_values() -> None:
    dapo = get_algorithm("dapo")
    assert (dapo.advantage_estimator, dapo.policy_loss, dapo.loss_aggregation) == ("grpo", "ppo_clip", "token-mean")
    assert (dapo.clip_low, dapo.clip_high) == (0.2, 0.28)
    assert dapo.dynamic_sampling and dapo.overlong_shaping
    gspo = get_algorithm("gspo")
    assert (gspo.policy_loss, gspo.loss_aggregation, gspo.clip_low, gspo.clip_high) == (
        "gspo", "seq-mean-token-mean", 3e-4, 4e-4)
    dr = get_algorithm("dr_grpo")
    assert (dr.advantage_estimator, dr.policy_loss, dr.loss_aggregation) == (
        "dr_grpo", "ppo_clip", "seq-mean-token-sum-norm")
    cispo = get_algorithm("cispo")
    assert (cispo.policy_loss, cispo.clip_low, cispo.clip_high) == ("cispo", 0.99, 4.0)
    assert get_algorithm("grpo").loss_aggregation == "token-mean"
    assert get_algorithm("rloo").advantage_estimator == "rloo"
    assert get_algorithm("reinforce_pp").advantage_estimator == "reinforce_pp_baseline"
    for name in ALGORITHMS:
        p = get_algorithm(name)
        if name != "dapo":
            assert not p.dynamic_sampling and not p.overlong_shaping


def test_preset_overrides_and_validation() -> None:
    p = get_algorithm("grpo")
    assert p.policy_loss_config(clip_high=0.3).clip_high == 0.3
    assert p.policy_loss_config(clip_low=None).clip_low == 0.2
    assert p.policy_loss_config(dual_clip_c=None).dual_clip_c is None
    assert p.policy_loss_config().dual_clip_c is None
    assert p.policy_loss_config(dual_clip_c=3.0).dual_clip_c == 3.0
    with pytest.raises(ValueError, match="dual_clip_c"):
        p.policy_loss_config(dual_clip_c=0.5)
    with pytest.raises(UnknownNameError, match="known"):
        p.with_overrides(policy_loss="ppo")
    assert p.with_overrides(loss_aggregation="token-mean").loss_aggregation == "token-mean"
    with pytest.raises(UnknownNameError, match="algorithm 'ppo'"):
        get_algorithm("ppo")
    with pytest.raises(Exception):
        p.name = "x"  # frozen


# ---- agreement with the API (operator/rft_api): the CRD enums and the API's preset table -----


API_ENUMS = {
    "ALGORITHMS": ALGORITHMS,
    "ADVANTAGE_ESTIMATORS": ADVANTAGE_ESTIMATORS,
    "POLICY_LOSSES": POLICY_LOSSES,
    "LOSS_AGGREGATIONS": LOSS_AGGREGATIONS,
    "KL_ESTIMATORS": KL_ESTIMATORS,
}


@pytest.mark.parametrize("name", sorted(API_ENUMS))
def test_registry_keys_equal_api_enums(name: str) -> None:
    from rft_api import constants

    assert set(API_ENUMS[name].names()) == set(getattr(constants, name))


def test_presets_equal_api_preset_table() -> None:
    from rft_api import constants
    from rft_api.presets import ALGORITHM_PRESETS

    assert set(ALGORITHM_PRESETS) == set(ALGORITHMS.names())
    fields = ("advantage_estimator", "policy_loss", "loss_aggregation", "clip_low", "clip_high",
              "dual_clip_c", "dynamic_sampling", "overlong_shaping")
    for name, api in ALGORITHM_PRESETS.items():
        ours = get_algorithm(name)
        diff = {f: (getattr(ours, f), getattr(api, f)) for f in fields if getattr(ours, f) != getattr(api, f)}
        assert diff == {}, f"preset {name}: runtime vs API {diff}"
        assert ours.group_relative == (name in constants.GROUP_RELATIVE_ALGORITHMS)
