"""Atomic checkpoints: the pointer is written last; a crash before it keeps the previous one;
retention; the step counter never goes backwards; trainer state round-trips exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rft_runtime.trainer.checkpoint import CheckpointError, CheckpointManager
from rft_runtime.trainer.state import ResumeError, TrainerState, read_checkpoint, write_checkpoint


def _writer(payload: str):
    def write(d):
        (d / "payload.txt").write_text(payload)
        (d / "sub").mkdir()
        (d / "sub" / "x.bin").write_bytes(b"\0" * 10)
    return write


def test_save_and_latest(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=2)
    assert m.latest() is None
    info = m.save(10, _writer("ten"))
    assert info.step == 10 and info.path.name == "step-000010"
    assert (tmp_path / "latest").read_text().strip() == "step-000010"
    assert (info.path / "payload.txt").read_text() == "ten" and (info.path / "COMPLETE").exists()
    assert m.latest().step == 10


def test_crash_before_pointer_keeps_previous_checkpoint(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=3)
    m.save(10, _writer("ten"))

    def crash():
        raise RuntimeError("killed between the files and the pointer")

    with pytest.raises(RuntimeError, match="killed"):
        m.save(20, _writer("twenty"), before_pointer=crash)
    # The new directory is complete on disk, but the pointer still names step 10.
    assert (tmp_path / "step-000020" / "COMPLETE").exists()
    latest = CheckpointManager(tmp_path).latest()
    assert latest.step == 10 and (latest.path / "payload.txt").read_text() == "ten"
    assert [c.step for c in m.committed()] == [10]
    # The next save (a resumed run redoing step 20) replaces the uncommitted leftover.
    m.save(20, _writer("twenty again"))
    assert (m.latest().path / "payload.txt").read_text() == "twenty again"


def test_crash_while_writing_files_leaves_no_checkpoint(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(1, _writer("one"))

    def broken(d):
        (d / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        m.save(2, broken)
    assert m.latest().step == 1
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_keep_last_prunes_oldest(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=2)
    for s in (1, 2, 3, 4):
        m.save(s, _writer(str(s)))
    assert [c.step for c in m.committed()] == [3, 4]
    assert not (tmp_path / "step-000001").exists()


def test_step_may_not_go_backwards(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(5, _writer("5"))
    with pytest.raises(CheckpointError, match="backwards"):
        m.save(4, _writer("4"))
    assert m.save(5, _writer("again")).step == 5  # same step: already committed, kept
    assert (m.latest().path / "payload.txt").read_text() == "5"


def test_dangling_pointer_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=5)
    m.save(3, _writer("3"))
    m.save(4, _writer("4"))
    (tmp_path / "step-000005").mkdir()  # incomplete: no COMPLETE marker
    (tmp_path / "latest").write_text("step-000009\n")
    assert m.latest().step == 4
    (tmp_path / "latest").write_text("step-000005\n")
    assert m.latest().step == 4


def test_missing_pointer_resumes_the_newest_and_the_next_save_deletes_nothing(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=5)
    for s in (1, 2, 3):
        m.save(s, _writer(str(s)))
    (tmp_path / "latest").unlink()
    assert m.latest().step == 3 and [c.step for c in m.committed()] == [1, 2, 3]
    m.save(4, _writer("4"))
    assert [c.step for c in m.committed()] == [1, 2, 3, 4]
    assert (tmp_path / "latest").read_text().strip() == "step-000004"


def test_temporaries_are_unique_per_attempt_and_only_earlier_attempts_are_cleaned(tmp_path):
    names = set()

    def capture(d):
        names.add(d.name)

    CheckpointManager(tmp_path, attempt=1).save(1, capture)
    CheckpointManager(tmp_path, attempt=1).save(2, capture)
    assert len(names) == 2 and all("-a1-" in n for n in names)
    earlier = tmp_path / ".tmp-step-000003-a0-abcdef"
    same = tmp_path / ".tmp-step-000003-a1-123456"   # another container of this attempt, mid-write
    later = tmp_path / ".tmp-step-000003-a2-123abc"
    foreign = tmp_path / ".tmp-step-000003-99"         # not this protocol's name
    for d in (earlier, same, later, foreign):
        d.mkdir()
    CheckpointManager(tmp_path, attempt=1).save(3, _writer("3"))
    assert not earlier.exists() and same.exists() and later.exists() and foreign.exists()
    # a trainer of attempt 1 starting again (resumed after a suspension, its pod evicted, a save cut
    # short by SIGKILL): the partial saves of its attempt's earlier processes go before it writes
    CheckpointManager(tmp_path, attempt=1).remove_leftovers()
    assert not same.exists() and later.exists() and foreign.exists()
    assert CheckpointManager(tmp_path, attempt=1).latest().step == 3


def test_trainer_state_roundtrip(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    model(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    opt.step()
    sched.step()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = TrainerState(step=7, policy_version=7, cursor={"epoch": 0, "index": 3}, next_seq=42,
                         counters={"samples_scored": 12}, run={"algorithm": "grpo", "lora": False})
    write_checkpoint(tmp_path, state, model, opt, sched)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))

    model2 = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 0.5 ** s)
    got = read_checkpoint(tmp_path, model2, opt2, sched2, expect_run={"algorithm": "grpo"})
    assert got.step == 7 and got.next_seq == 42 and got.counters == {"samples_scored": 12}
    for (n, p), (_, q) in zip(model.named_parameters(), model2.named_parameters()):
        assert torch.equal(p, q), n
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert sched2.state_dict()["last_epoch"] == 1
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    with pytest.raises(ResumeError, match="algorithm='grpo'"):
        read_checkpoint(tmp_path, model2, opt2, sched2, expect_run={"algorithm": "dapo"})
