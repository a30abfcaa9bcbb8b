"""The trainer on torch.distributed (CPU, gloo): results do not depend on the world size.

The same job trained 3 steps at world size 1, 2 and 4 (each rank trains its rows of every batch;
the loss normaliser is global; FSDP2 shards the policy and the reference) ends with the same
weights to 2e-5 (float32: over several ranks every micro-batch runs its prompts and continuations as
two forward passes, :mod:`rft_runtime.trainer.prefix`, where one rank runs a micro-batch without a
shared prompt in one; the two round differently, and 6 AdamW steps at 1e-3 carry that to about 1e-5),
and a world-size-2 run resumed from a world-size-1 distributed checkpoint
of step 1 ends exactly where the uninterrupted run does (and a world-size-1 run, a plain module,
resumed from a world-size-2 checkpoint of FSDP2 shards, where it does to the same bound). The ranks are real processes
(``tests/trainer/dist_harness.py``) in one gloo process group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from rft_api.job import validate_spec
from rft_runtime.trainer.compiled import missing_toolchain
from tests.support.ports import free_port
from tests.support.runtime_config import local_config
from tests.trainer.dist_harness import run_rank

STEPS = [1, 2, 3]
ATOL = 2e-5


def _config(tmp_path: Path, model_dir: Path, world: int, lora: bool = False, compile: str | None = None) -> str:
    spec = validate_spec({
        "model": {"base": str(model_dir), **({"lora": {"rank": 4}} if lora else {})},
        "dataset": {"train": {"builtin": "arithmetic", "size": 8}},
        "evaluator": {"builtin": "regex", "config": {"pattern": "[0-9]"}},
        "rollout": {"samplesPerPrompt": 2, "promptsPerStep": 5, "maxTokens": 6},
        # KL in the loss: the sharded reference runs too; two epochs: a second optimiser step per batch.
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": 3, "microBatchSize": 2,
                    "epochsPerStep": 2, "kl": {"coef": 0.05}, "processesPerNode": world,
                    **({"compile": compile} if compile else {})},
    })
    return local_config("dist", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "ckpt",
                        output=tmp_path / "out").to_json()


def _train(tmp_path: Path, model_dir: Path, world: int, name: str, *, steps: list[int] = STEPS,
           resume_from: Path | None = None, save_after: int | None = None,
           lora: bool = False, bf16_compute: bool = False, compile: str | None = None) -> dict[str, torch.Tensor]:
    out = tmp_path / name
    out.mkdir()
    try:
        mp.spawn(run_rank, nprocs=world, join=True,
                 args=(_config(tmp_path, model_dir, world, lora, compile), free_port(), steps, str(out),
                       str(resume_from) if resume_from else None, save_after, bf16_compute))
    except ProcessException:
        for log in sorted(out.glob("rank-*.log")):
            print(f"--- {log.name}\n{log.read_text()[-4000:]}")
        raise
    return torch.load(out / "weights.pt")


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=ATOL, msg=k)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, dict]:
    """World size 1, 3 steps, a distributed checkpoint after step 1."""
    tmp = tmp_path_factory.mktemp("ws1")
    return tmp, _train(tmp, tiny_model_dir, 1, "run", save_after=1)


@pytest.mark.parametrize("world", [2, 4])
def test_same_weights_at_every_world_size(tmp_path, tiny_model_dir, reference_run, world):
    _, want = reference_run
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    assert moved > 100 * ATOL  # the 3 steps really changed the weights: the comparison below means something
    _assert_same(_train(tmp_path, tiny_model_dir, world, f"ws{world}"), want)


def test_resume_at_another_world_size(tmp_path, tiny_model_dir, reference_run):
    ws1_dir, want = reference_run
    ckpt = ws1_dir / "run" / "ckpt-1"
    assert (ckpt / "dcp").is_dir() and (ckpt / "weights.safetensors").is_file()
    _assert_same(_train(tmp_path, tiny_model_dir, 2, "resumed", steps=[2, 3], resume_from=ckpt), want)


def test_resume_a_sharded_checkpoint_at_world_size_1(tmp_path, tiny_model_dir, reference_run):
    """One CPU process trains a plain module (no FSDP2); the checkpoint a world-size-2 run wrote of its
    sharded policy, reference and optimiser loads into it, and the run ends where one process ends."""
    _, want = reference_run
    _train(tmp_path, tiny_model_dir, 2, "ws2", steps=[1], save_after=1)
    ckpt = tmp_path / "ws2" / "ckpt-1"
    assert (ckpt / "dcp").is_dir()
    _assert_same(_train(tmp_path, tiny_model_dir, 1, "resumed", steps=[2, 3], resume_from=ckpt), want)


@pytest.mark.skipif(missing_toolchain(torch.device("cpu")) is not None, reason="TorchInductor's CPU backend needs a C++ compiler")
def test_compiled_layers_under_fsdp2_train_as_one_eager_process(tmp_path, tiny_model_dir, reference_run):
    """``trainer.compile: always`` at world size 2: every decoder layer of the FSDP2-sharded policy and
    reference runs compiled (FSDP2's hooks around it, uncompiled), and the three steps end where the
    eager world-size-1 run ends."""
    _, want = reference_run
    got = _train(tmp_path, tiny_model_dir, 2, "ws2c", compile="always")
    logs = "".join(p.read_text() for p in (tmp_path / "ws2c").glob("rank-*.log"))
    assert logs.count("compiling 2 decoder layers") == 4, logs[-3000:]  # policy and reference, on each rank
    _assert_same(got, want)


def test_lora_adapter_trains_the_same_at_world_size_2(tmp_path, tiny_model_dir):
    """LoRA under FSDP2: only the adapter moves, the reference is the policy with the adapter disabled,
    and two ranks end where one does."""
    one = _train(tmp_path, tiny_model_dir, 1, "lora1", steps=[1, 2], lora=True)
    two = _train(tmp_path, tiny_model_dir, 2, "lora2", steps=[1, 2], lora=True)
    _assert_same(two, one)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    adapter = [k for k in one if "lora_" in k]
    assert adapter and any(float(one[k].abs().max()) > 0 for k in adapter if "lora_B" in k)  # lora_B starts at 0
    for k, v in one.items():  # the base weights stay frozen
        if "lora_" not in k:
            name = k.replace("base_model.model.", "").replace(".base_layer", "")
            torch.testing.assert_close(v, base[name], rtol=0, atol=0, msg=k)


def test_bfloat16_compute_at_world_size_1_and_2(tmp_path, tiny_model_dir, reference_run):
    """``model.dtype: auto`` on a GPU: float32 weights, bfloat16 compute; one process runs a plain module
    under autocast, two run FSDP2's mixed precision. Both train (with the KL reference, a distributed
    checkpoint and its resume) in the direction the float32 run does and each other's, and really compute
    in bfloat16 (they differ from float32 by more than float32's rounding). AdamW turns a gradient that
    rounding flips into a full step the other way, so the updates are compared as a whole (cosine)."""
    _, fp32 = reference_run
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    one = _train(tmp_path, tiny_model_dir, 1, "ws1", save_after=1, bf16_compute=True)
    two = _train(tmp_path, tiny_model_dir, 2, "ws2", bf16_compute=True)

    def update(w: dict) -> torch.Tensor:
        return torch.cat([(w[k] - start[k]).flatten() for k in sorted(start)])

    def cos(a: dict, b: dict) -> float:
        return float(torch.nn.functional.cosine_similarity(update(a), update(b), dim=0))

    def diff(a: dict, b: dict) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in b)

    assert diff(one, fp32) > 10 * ATOL and diff(two, fp32) > 10 * ATOL  # bfloat16 was used
    # measured 0.9994 / 0.9993 / 0.9992
    similar = {"one/fp32": cos(one, fp32), "two/fp32": cos(two, fp32), "one/two": cos(one, two)}
    assert min(similar.values()) > 0.99, similar
    resumed = _train(tmp_path, tiny_model_dir, 1, "resumed", steps=[2, 3], resume_from=tmp_path / "ws1" / "ckpt-1",
                     bf16_compute=True)
    _assert_same(resumed, one)
