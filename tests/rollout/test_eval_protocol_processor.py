"""The training-aware Eval Protocol rollout processor against our builtin inference server.

An evaluation test that names :class:`RFTRolloutProcessor` runs under pytest with Eval Protocol's own
plugin and decorator (a subprocess, as a user would run it); its rows are read back with
``EvaluationRow.model_validate_json``, their ``execution_metadata.extra`` checked field by field
against the engine's token contract, and then handed to the trainer: split per completion, scored by
the example's evaluation test, turned into episodes and batched, with the trainer's own log-probs of
the sampled tokens equal to the inference ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rft_runtime.integrations.eval_protocol import RFTRolloutProcessor, episodes_from_rows, split_row
from rft_runtime.rewards.eval_protocol import import_eval_protocol
from rft_runtime.rollout import ChatTokenizer

from .conftest import MODEL_NAME, TINY_MODEL

_models = import_eval_protocol()  # eval_protocol through our import: offline, logging left as it was
EvaluationRow, InputMetadata, Message = _models.EvaluationRow, _models.InputMetadata, _models.Message

EXTRA_KEYS = {"prompt_ids", "completion_ids", "inference_logprobs", "completions_text", "truncated", "finish_reasons"}

EVAL_TEST = textwrap.dedent('''
    import os

    from eval_protocol.models import EvaluateResult, EvaluationRow
    from eval_protocol.pytest import evaluation_test

    from rft_runtime.integrations.eval_protocol import RFTRolloutProcessor


    @evaluation_test(
        input_messages=[[[{"role": "user", "content": "What is 2 + 3?"}],
                         [{"role": "user", "content": "What is 7 + 1?"}]]],
        completion_params=[{"model": os.environ["RFT_SERVED_MODEL"], "temperature": 1.0, "max_tokens": 8, "n": 4}],
        rollout_processor=RFTRolloutProcessor(tokenizer=os.environ["RFT_TOKENIZER"]),
        mode="pointwise",
    )
    def test_rows_are_training_ready(row: EvaluationRow) -> EvaluationRow:
        with open(os.environ["ROWS_OUT"], "a") as out:
            out.write(row.model_dump_json() + "\\n")
        row.evaluation_result = EvaluateResult(score=1.0, reason="rolled out")
        return row
''')


def check_row(row: Any, tok: ChatTokenizer, n: int) -> None:
    """The extra fields have exactly the processor's shapes and agree with the prompt and each other."""
    extra = row.execution_metadata.extra
    assert EXTRA_KEYS <= set(extra)
    prompt = [m.model_dump(exclude_none=True) for m in row.messages[:-1]]
    assert extra["prompt_ids"] == tok.encode_chat(prompt) and all(type(t) is int for t in extra["prompt_ids"])
    assert len(extra["completion_ids"]) == len(extra["inference_logprobs"]) == n
    for ids, lps, text, trunc, fin in zip(extra["completion_ids"], extra["inference_logprobs"], extra["completions_text"],
                                          extra["truncated"], extra["finish_reasons"]):
        assert ids and all(type(t) is int for t in ids)
        assert len(lps) == len(ids) and all(isinstance(x, float) and x <= 0.0 for x in lps)
        assert text == tok.decode(ids)
        assert fin in ("stop", "length") and trunc == (fin == "length")
    assert row.messages[-1].role == "assistant" and row.messages[-1].content == extra["completions_text"][0]
    assert isinstance(extra["policy_version"], int)


async def test_rows_are_training_ready_and_keep_existing_extra(builtin_server, chat_tokenizer):
    from eval_protocol.pytest.types import RolloutProcessorConfig

    processor = RFTRolloutProcessor(tokenizer=TINY_MODEL, base_url=builtin_server, model=MODEL_NAME, n=3)
    row = EvaluationRow(messages=[Message(role="user", content="What is 2 + 3?")], ground_truth="5",
                        input_metadata=InputMetadata(row_id="sum-1"))
    row.execution_metadata.extra = {"from_dataset": "kept"}
    config = RolloutProcessorConfig(completion_params={"temperature": 1.0, "max_tokens": 6}, mcp_config_path="",
                                    semaphore=asyncio.Semaphore(2))
    (done,) = await asyncio.gather(*processor([row], config))
    await processor.acleanup()
    again = EvaluationRow.model_validate(json.loads(done.model_dump_json()))
    check_row(again, chat_tokenizer, 3)
    assert again.execution_metadata.extra["from_dataset"] == "kept"
    assert again.execution_metadata.finish_reason == again.execution_metadata.extra["finish_reasons"][0]


async def test_biasing_sampling_params_are_refused(builtin_server):
    processor = RFTRolloutProcessor(tokenizer=TINY_MODEL, base_url=builtin_server, model=MODEL_NAME)
    row = EvaluationRow(messages=[Message(role="user", content="hi")])
    with pytest.raises(ValueError, match=r"completion_params \['top_p'\] would bias the training log-probs"):
        await processor.rollout(row, {"top_p": 0.9})
    await processor.acleanup()


@pytest.mark.slow
async def test_an_evaluation_test_under_pytest_produces_rows_the_trainer_consumes(builtin_server, chat_tokenizer, tmp_path):
    test_file = tmp_path / "test_rollouts.py"
    test_file.write_text(EVAL_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    rows_out = tmp_path / "rows.jsonl"
    env = {**os.environ, "RFT_INFERENCE_URL": builtin_server, "RFT_SERVED_MODEL": MODEL_NAME,
           "RFT_TOKENIZER": str(TINY_MODEL), "ROWS_OUT": str(rows_out), "HOME": str(tmp_path),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "DISABLE_EP_SQLITE_LOG": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")) if p)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
        "--rootdir", str(tmp_path), str(test_file), cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "ep-max-rows" not in text  # the plugin loaded quietly; the test ran through Eval Protocol
    rows = [EvaluationRow.model_validate_json(line) for line in rows_out.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        check_row(row, chat_tokenizer, 4)
        assert row.input_metadata.row_id  # Eval Protocol gave each row its id

    # the trainer's side: one row per completion, scored by an Eval Protocol test, as episodes
    from rft_runtime.rewards.eval_protocol import EvalProtocolEvaluator
    from tests.rewards.test_eval_protocol import example_file

    evaluator = EvalProtocolEvaluator.load(path=str(example_file(tmp_path)))
    singles = [one for row in rows for one in split_row(row)]
    assert len(singles) == 8
    for one in singles:
        one.ground_truth = "5"
        scored = await evaluator.fn(one)
        assert scored.evaluation_result is not None
    episodes = episodes_from_rows(singles)
    assert sorted({e.task_id for e in episodes}) == sorted({r.input_metadata.row_id for r in rows})
    assert sorted(e.rollout_idx for e in episodes) == [0, 0, 1, 1, 2, 2, 3, 3]

    import torch

    from rft_runtime.trainer.batch import collate, sequences_from_groups
    from rft_runtime.trainer.learner import sequence_logprobs

    groups = [SimpleNamespace(key=k, episodes=[e for e in episodes if e.task_id == k]) for k in {e.task_id for e in episodes}]
    seqs = sequences_from_groups(groups)
    assert len(seqs) == 8 and all(s.reward is not None for s in seqs)
    batch = collate(seqs)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(TINY_MODEL), local_files_only=True, dtype=torch.float32)
    ours = sequence_logprobs(model, batch, temperature=1.0, micro_batch_size=8)
    mask = batch.loss_mask.bool()
    assert torch.allclose(ours[mask], batch.inference_logprobs[mask], atol=2e-4)
