"""Registries: exact keys, duplicates refused, unknown names listed, presets consistent."""

from __future__ import annotations

import pytest

from rft_api import constants
from rft_api.presets import ALGORITHM_PRESETS
from rft_runtime.algos import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    TIS_MODES,
    DuplicateRegistrationError,
    PolicyLossConfig,
    Registry,
    UnknownNameError,
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
    class Widget:
        pass

    typed: Registry = Registry("widget", entry_type=Widget)
    with pytest.raises(TypeError, match="Widget"):
        typed.register("x", a)


@pytest.mark.parametrize("reg_name", ["ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "LOSS_AGGREGATIONS", "KL_ESTIMATORS", "TIS_MODES"])
def test_entries_document_shapes_and_equation(reg_name: str) -> None:
    reg, _ = ALL[reg_name]
    for key, fn in reg.items():
        doc = fn.__doc__ or ""
        assert "Shape" in doc, f"{reg_name}[{key}] docstring lacks shapes"
        assert "=" in doc, f"{reg_name}[{key}] docstring lacks its equation"


# ---- agreement with the API (api/rft_api): the CRD enums and the API's preset table -----


@pytest.mark.parametrize("name", sorted(ALGORITHM_PRESETS))
def test_presets_refer_to_registered_entries(name: str) -> None:
    p = ALGORITHM_PRESETS[name]
    assert p.advantage_estimator in ADVANTAGE_ESTIMATORS
    assert p.policy_loss in POLICY_LOSSES
    assert p.loss_aggregation in LOSS_AGGREGATIONS
    assert name in constants.GROUP_RELATIVE_ALGORITHMS
    cfg = PolicyLossConfig(clip_low=p.clip_low, clip_high=p.clip_high, dual_clip_c=p.dual_clip_c)
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip_c) == (p.clip_low, p.clip_high, p.dual_clip_c)
    assert p.reference


def test_preset_values() -> None:
    dapo = ALGORITHM_PRESETS["dapo"]
    assert (dapo.advantage_estimator, dapo.policy_loss, dapo.loss_aggregation) == ("grpo", "ppo_clip", "token-mean")
    assert (dapo.clip_low, dapo.clip_high) == (0.2, 0.28)
    assert dapo.dynamic_sampling and dapo.overlong_shaping
    gspo = ALGORITHM_PRESETS["gspo"]
    assert (gspo.policy_loss, gspo.loss_aggregation, gspo.clip_low, gspo.clip_high) == (
        "gspo", "seq-mean-token-mean", 3e-4, 4e-4)
    dr = ALGORITHM_PRESETS["dr_grpo"]
    assert (dr.advantage_estimator, dr.policy_loss, dr.loss_aggregation) == (
        "dr_grpo", "ppo_clip", "seq-mean-token-sum-norm")
    cispo = ALGORITHM_PRESETS["cispo"]
    assert (cispo.policy_loss, cispo.clip_low, cispo.clip_high) == ("cispo", 0.99, 4.0)
    assert ALGORITHM_PRESETS["grpo"].loss_aggregation == "token-mean"
    assert ALGORITHM_PRESETS["rloo"].advantage_estimator == "rloo"
    assert ALGORITHM_PRESETS["reinforce_pp"].advantage_estimator == "reinforce_pp_baseline"
    for name, p in ALGORITHM_PRESETS.items():
        if name != "dapo":
            assert not p.dynamic_sampling and not p.overlong_shaping


def test_policy_loss_config_validation() -> None:
    assert PolicyLossConfig(dual_clip_c=3.0).dual_clip_c == 3.0
    with pytest.raises(ValueError, match="dual_clip_c"):
        PolicyLossConfig(dual_clip_c=0.5)
    with pytest.raises(ValueError, match="clip_low"):
        PolicyLossConfig(clip_low=-1)


API_ENUMS = {
    "ADVANTAGE_ESTIMATORS": ADVANTAGE_ESTIMATORS,
    "POLICY_LOSSES": POLICY_LOSSES,
    "LOSS_AGGREGATIONS": LOSS_AGGREGATIONS,
    "KL_ESTIMATORS": KL_ESTIMATORS,
}


@pytest.mark.parametrize("name", sorted(API_ENUMS))
def test_registry_keys_equal_api_enums(name: str) -> None:
    assert set(API_ENUMS[name].names()) == set(getattr(constants, name))


def test_preset_table_covers_the_algorithm_enum() -> None:
    assert set(ALGORITHM_PRESETS) == set(constants.ALGORITHMS)
