"""examples/09-real-model.yaml's parts on the real model, SmolLM2-135M-Instruct (tests/support/models.py), with
GSM8K's one- and two-operation problems as hack/gsm8k_easy.py writes them (2080 training and 344 held-out
problems from the pinned GSM8K, disjoint, the same bytes every run):

- after one real training step with the example's settings (GRPO advantages, the learner's update, the
  trainer's publication to the builtin engine through ``/update_weights_from_disk``), the engine's
  log-probs of fresh samples equal the updated trainer's to :data:`ATOL` (float32), while the update
  moved them by far more than that: the engine serves the new weights, and the train / inference
  mismatch stays where test_smollm2.py measures it before any update;
- the prompt the rollout sends for a GSM8K task (read through the example's field mapping) is exactly
  ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` of the tokenizer's own files;
- the final model the trainer exports (``export_final``: ``<checkpoints>/final/``) loads with plain
  ``AutoModelForCausalLM`` and ``AutoTokenizer``, holds the trained weights and generates what the trained
  policy generates.

The training step's rewards are set (1 for even sample indices, 0 for odd) instead of scored: a base model
that answers every sample of a problem alike would leave every GRPO advantage 0 and the step would move
nothing. Cost: about 40 s of CPU (one model load for the trainer, one for the engine, two short rollouts,
an update on 4 sequences).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from tests.models.test_smollm2 import ATOL, GSM8K_TEST_SHA256, SERVED, builtin_server
from tests.support.shared import pinned_files

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "09-real-model.yaml"
TASKS = 2
SAMPLES = 2
MAX_TOKENS = 24
LR = 2e-5
"""The step's learning rate: the example's order of magnitude, large enough that one step moves
log-probs by well over :data:`ATOL`."""
GSM8K_TRAIN_SHA256 = "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"
"""``shared/datasets/gsm8k/train.jsonl`` (openai/gsm8k, main split ``train``; tests/runtime/test_data_files.py)."""


def _gsm8k_easy() -> Any:
    spec = importlib.util.spec_from_file_location("gsm8k_easy", ROOT / "hack" / "gsm8k_easy.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def job() -> Any:
    from rft_api.job import load_manifest

    return load_manifest(str(EXAMPLE))


@pytest.fixture(scope="module")
def easy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GSM8K's one- and two-operation problems, written by hack/gsm8k_easy.py from the pinned GSM8K."""
    test, _ = pinned_files("datasets/gsm8k", {"test.jsonl": GSM8K_TEST_SHA256, "train.jsonl": GSM8K_TRAIN_SHA256})
    out = tmp_path_factory.mktemp("gsm8k-easy")
    assert _gsm8k_easy().main(["--src", str(test.parent), "--out", str(out)]) == 0
    return out


def test_the_easy_problems_are_held_out_and_written_the_same_every_time(easy_dir: Path, tmp_path: Path) -> None:
    """hack/gsm8k_easy.py: one or two operations each (``<<...>>`` annotations counted), no test question in
    the training file, and byte-identical files from a second run."""
    mod = _gsm8k_easy()
    assert mod.operations("Half: 48/2=<<48/2=24>>24\nIn all 48+24=<<48+24=72>>72\n#### 72") == 2
    assert mod.operations("16 - 3 - 4 = <<16-3-4=9>>9 eggs, 9 * 2 = <<9*2=18>>18\n#### 18") == 3
    assert mod.operations("<<-5+2=-3>>-3\n#### -3") == 1 and mod.operations("no annotation\n#### 4") == 0
    rows = {split: [json.loads(line) for line in (easy_dir / f"{split}.jsonl").open()] for split in ("train", "test")}
    assert (len(rows["train"]), len(rows["test"])) == (2080, 344)
    assert all(r["operations"] == mod.operations(r["answer"]) and 1 <= r["operations"] <= 2
               for r in rows["train"] + rows["test"])
    assert not {r["question"] for r in rows["train"]} & {r["question"] for r in rows["test"]}
    (src,) = pinned_files("datasets/gsm8k", {"test.jsonl": GSM8K_TEST_SHA256})
    assert mod.main(["--src", str(src.parent), "--out", str(tmp_path)]) == 0
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / name).read_bytes() == (easy_dir / name).read_bytes(), name


@pytest.fixture(scope="module")
def tasks(job: Any, easy_dir: Path) -> list[Any]:
    """The first held-out tasks, read as the trainer reads the example's ``dataset.eval`` (its field mapping)."""
    from rft_runtime.trainer.datasets import load_path

    loaded = load_path(job.spec.dataset.eval, easy_dir / "test.jsonl", "spec.dataset.eval")
    assert len(loaded) > 300 and all(1 <= t.metadata["operations"] <= 2 for t in loaded)
    assert loaded[0].task_id.startswith("gsm8k-test-") and "####" in str(loaded[0].ground_truth)
    return loaded


@pytest.fixture(scope="module")
def tokenizer(smollm2: Path) -> Any:
    from rft_runtime.model.loading import load_tokenizer

    return load_tokenizer(smollm2)


@pytest.fixture(scope="module")
def server(smollm2: Path) -> Iterator[str]:
    with builtin_server(smollm2) as url:
        yield url


def rollout(url: str, tokenizer: Any, tasks: list[Any], *, n: int, max_tokens: int, temperature: float,
            version: int, seed: int) -> list[Any]:
    """Each task rolled out ``n`` times by the rollout's own worker (exact tokens) against ``url``: the episodes."""
    from rft_runtime.rollout import ChatTokenizer
    from rft_runtime.rollout.client import InferenceClient
    from rft_runtime.rollout.sampling import SamplingParams
    from rft_runtime.rollout.worker import RolloutWorker

    async def run() -> list[Any]:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
        async with InferenceClient(url, SERVED, n_per_request=True) as client:
            worker = RolloutWorker(client, ChatTokenizer(tokenizer))
            try:
                out = []
                for t in tasks:
                    out += await worker.rollout_task(t, n, sampling, version)
                return out
            finally:
                worker.close()

    return asyncio.run(run())


def train_sequences(episodes: list[Any]) -> list[Any]:
    from rft_runtime.trainer.batch import sequences_from_episode

    seqs = [s for ep in episodes for s in sequences_from_episode(ep)]
    assert all(s.response_ids and len(s.inference_logprobs) == len(s.response_ids) for s in seqs)
    return seqs


@pytest.fixture(scope="module")
def trained(smollm2: Path, job: Any, tokenizer: Any, tasks: list[Any], server: str,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One training step of the example's algorithm on samples of the base model, published to the engine
    as policy version 1 (the trainer's publisher); the policy before (its state) and after."""
    from rft_api.presets import resolve_algorithm
    from rft_api.spec import ModelSpec
    from rft_runtime.trainer.batch import collate
    from rft_runtime.trainer.learner import Learner, build_optimizer, learner_config
    from rft_runtime.trainer.model_io import load_policy
    from rft_runtime.trainer.publisher import WeightPublisher
    from rft_runtime.trainer.signals import advantages

    spec = job.spec
    alg = resolve_algorithm(spec)
    temperature = spec.rollout.temperature
    episodes = rollout(server, tokenizer, tasks[:TASKS], n=SAMPLES, max_tokens=MAX_TOKENS, temperature=temperature,
                       version=0, seed=7)
    seqs = train_sequences(episodes)
    for i, s in enumerate(seqs):
        s.reward = float(i % 2 == 0)
    policy = load_policy(ModelSpec(base=str(smollm2)), smollm2, seed=spec.trainer.seed)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    params = [p for p in policy.parameters() if p.requires_grad]
    learner = Learner(policy, learner_config(alg, spec), build_optimizer(params, LR, spec.trainer.weight_decay))
    batch = collate(seqs, pad_id=tokenizer.pad_token_id)
    adv = advantages(seqs, torch.tensor([s.reward for s in seqs], dtype=torch.float32), alg)
    assert bool((adv.advantages != 0).any())
    learner.update(batch, adv.advantages, adv.valid, None)
    moved = sum(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert moved >= 0.9 * len(before), f"only {moved} of {len(before)} tensors moved"
    publisher = WeightPublisher(tmp_path_factory.mktemp("weights"), [server])
    publisher.publish(policy, 1, tokenizer)
    return {"policy": policy, "before": before, "temperature": temperature}


def test_engine_logprobs_equal_the_trainers_after_a_training_step(trained: dict[str, Any], server: str,
                                                                  tokenizer: Any, tasks: list[Any]) -> None:
    from rft_runtime.trainer.batch import collate
    from rft_runtime.trainer.learner import sequence_logprobs

    policy, temperature = trained["policy"], trained["temperature"]
    episodes = rollout(server, tokenizer, tasks[:TASKS], n=SAMPLES, max_tokens=MAX_TOKENS, temperature=temperature,
                       version=1, seed=11)
    seqs = train_sequences(episodes)
    assert {s.version for s in seqs} == {1}
    batch = collate(seqs, pad_id=tokenizer.pad_token_id)
    mask = batch.loss_mask.bool()
    after = sequence_logprobs(policy, batch, temperature=temperature, micro_batch_size=8)
    engine = batch.inference_logprobs
    mismatch = float((after - engine).abs()[mask].max())
    updated = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    try:
        policy.load_state_dict(trained["before"])
        base = sequence_logprobs(policy, batch, temperature=temperature, micro_batch_size=8)
    finally:
        policy.load_state_dict(updated)
    moved = float((after - base).abs()[mask].max())
    print(f"after one step: max |engine - trainer| = {mismatch:.2e} over {int(mask.sum())} tokens; "
          f"the step moved log-probs by up to {moved:.2e}")
    assert mismatch <= ATOL, f"max |engine logprob - trainer logprob| = {mismatch:.2e} after the update"
    assert moved > 20 * ATOL, f"the step moved log-probs by {moved:.2e} only: not a test of the new weights"


def test_rollout_prompts_are_the_tokenizers_chat_template(smollm2: Path, server: str, tokenizer: Any,
                                                         tasks: list[Any]) -> None:
    """The rollout's prompt ids for GSM8K tasks (a ``prompt`` column becomes one user message; SmolLM2's
    template adds its system prompt) are those of ``apply_chat_template`` with the model directory's own
    tokenizer files, loaded by plain ``AutoTokenizer``."""
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(smollm2), local_files_only=True)
    chosen = tasks[:4]
    episodes = rollout(server, tokenizer, chosen, n=1, max_tokens=1, temperature=1.0, version=-1, seed=3)
    for task, ep in zip(chosen, episodes):
        messages = [{"role": "user", "content": task.prompt}]
        want = plain.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        want = [int(t) for t in (want["input_ids"] if not isinstance(want, list) else want)]
        (traj,) = ep.trajectories
        assert list(traj.steps[0].prompt_ids) == want, task.task_id
        text = plain.decode(want)
        assert text.endswith("<|im_start|>assistant\n") and task.prompt in text and "<|im_start|>system" in text


def test_the_exported_final_model_loads_with_plain_transformers(trained: dict[str, Any], job: Any, smollm2: Path,
                                                                tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rft_api import runtime
    from rft_runtime.trainer.publication import export_final

    cfg = runtime.build(job, endpoints=runtime.Endpoints(inference=["http://127.0.0.1:1"], served_model_name=SERVED,
                                                         coordinator="http://127.0.0.1:2"),
                        ports=runtime.Ports(), scoring="rollout", progress=runtime.ProgressTarget(sink="file"),
                        paths=runtime.spec_paths(job.spec, checkpoints=str(tmp_path / "checkpoints"), model_cache=None))
    policy = trained["policy"]
    final = export_final(policy, tokenizer, policy.state_dict(), cfg, smollm2)
    assert final.format == "full" and final.merged_path is None
    where = tmp_path / "checkpoints" / final.path
    model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    exported = model.state_dict()
    for name, tensor in policy.state_dict().items():
        assert torch.equal(exported[name], tensor), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
        ref = policy.generate(**prompt, max_new_tokens=12, do_sample=False, use_cache=True)
    new = out[0, prompt["input_ids"].shape[1]:]
    text = tok.decode(new, skip_special_tokens=True)
    print(f"final model: {text!r}")
    assert torch.equal(out, ref) and text.strip(), text
    assert json.loads((where / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
