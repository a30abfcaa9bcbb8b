"""The Python validation (shared with the operator) rejects every invalid case, naming the field."""
import pytest

from rft_api import InvalidSpec, parse_manifest
from tests.api.cases import base_manifest, invalid_cases

CASES = invalid_cases()


def test_corpus_is_large_enough():
    assert len(CASES) >= 20
    assert len({c["id"] for c in CASES}) == len(CASES)


def test_base_manifest_is_valid():
    job = parse_manifest(base_manifest())
    assert job.name == "tiny-arith"
    assert job.spec.rollout.samples_per_prompt == 8
    assert job.spec.trainer.max_steps == 30


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_invalid_manifest_rejected_naming_field(case):
    with pytest.raises(InvalidSpec) as err:
        parse_manifest(case["manifest"])
    assert any(p.startswith(case["field"]) for p in err.value.problems), err.value.problems


def test_all_problems_reported_at_once():
    m = base_manifest()
    m["spec"]["trainer"]["learningRate"] = 0
    m["spec"]["rollout"]["topP"] = 2
    m["metadata"]["name"] = "Bad"
    with pytest.raises(InvalidSpec) as err:
        parse_manifest(m)
    fields = " ".join(err.value.problems)
    for f in ("spec.trainer.learningRate", "spec.rollout.topP", "metadata.name"):
        assert f in fields


@pytest.mark.parametrize("trainer, processes, world", [
    ({}, 1, 1),                                                               # CPU: one process per pod
    ({"nodes": 3}, 1, 3),
    ({"resources": {"limits": {"nvidia.com/gpu": 4}}}, 4, 4),                # default: one per GPU
    ({"nodes": 2, "resources": {"requests": {"nvidia.com/gpu": "2"}}}, 2, 4),
    ({"nodes": 2, "processesPerNode": 1, "resources": {"limits": {"nvidia.com/gpu": 8}}}, 1, 2),
    ({"processesPerNode": 4}, 4, 4),                                          # CPU processes: not bounded by GPUs
])
def test_trainer_processes_per_node(trainer, processes, world):
    m = base_manifest()
    m["spec"]["trainer"].update(trainer)
    t = parse_manifest(m).spec.trainer
    assert (t.processes(), t.world_size()) == (processes, world)


@pytest.mark.parametrize("args, problem", [
    (["--kv-cache-dtype", "float8"], "--kv-cache-dtype 'float8': expected auto|float32|float16|bfloat16"),
    (["--max-batch-size=0"], "--max-batch-size '0': expected N"),
    (["--max-batch-size"], "--max-batch-size needs a value (N)"),
    (["--device", "--enforce-eager"], "--device needs a value (auto|cpu|cuda[:N])"),
    (["--enforce-eager=yes"], "--enforce-eager takes no value"),
    (["--enforce-eager", "16"], "'16' follows no option that takes a value"),
    (["--policy-version", "3"], "--policy-version is not an option of the builtin engine"),
])
def test_builtin_engine_extra_args_values_are_checked(args, problem):
    """Beyond the option names (which the CRD checks too), the operator's validation checks each value of the
    builtin engine's options and says which one is wrong, so that a typo is refused instead of crash-looping
    the inference pods."""
    m = base_manifest()
    m["spec"]["inference"]["extraArgs"] = args
    with pytest.raises(InvalidSpec) as err:
        parse_manifest(m)
    assert err.value.problems[0].startswith(f"spec.inference.extraArgs: {problem}; "), err.value.problems


def test_builtin_engine_extra_args_accepted_and_vllms_passed_as_given():
    m = base_manifest()
    args = ["--max-batch-size", "64", "--kv-cache-dtype=float16", "--device", "cuda:1", "--no-engine-process",
            "--enforce-eager", "--engine-pacing", "never", "--health-timeout", "2.5", "--log-level", "DEBUG",
            "--trust-request-chat-template", "--threads=4"]
    m["spec"]["inference"]["extraArgs"] = args
    assert parse_manifest(m).spec.inference.extra_args == args
    m["spec"]["inference"].update(engine="vllm", weightSync="lora", extraArgs=["--enforce-eager", "--swap-space", "4"])
    m["spec"]["model"]["lora"] = {"rank": 8}
    assert parse_manifest(m).spec.inference.extra_args == ["--enforce-eager", "--swap-space", "4"]


def test_an_evaluator_config_too_large_for_its_configmap_is_refused_naming_it():
    """The API server takes any object its CEL can read; the size only Python can measure (the
    operator marks the job ValidationFailed, ``rft run`` refuses it)."""
    manifest = base_manifest()
    manifest["spec"]["evaluator"] = {"builtin": "string_check", "config": {"reference": "x" * 300_000}}
    with pytest.raises(InvalidSpec) as err:
        parse_manifest(manifest)
    assert "spec.evaluator.config" in str(err.value) and "more than 262144" in str(err.value)
    manifest["spec"]["evaluator"]["config"]["reference"] = "x" * 1000
    parse_manifest(manifest)


def test_quantities_compare_by_value():
    from rft_api.spec import quantity_value

    assert quantity_value("1500m") == quantity_value("1.5") < quantity_value(2)
    assert quantity_value("1Gi") > quantity_value("1G") > quantity_value("1M")
    with pytest.raises(ValueError, match="not a quantity"):
        quantity_value("ten")
