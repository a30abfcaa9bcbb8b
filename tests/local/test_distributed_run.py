"""``rft run`` honours trainer.nodes × processesPerNode: that many trainer processes on this machine
in one gloo process group (rank 0 in the trainer actor, the others started beside it)."""

from __future__ import annotations

import json

STEPS = 2


def test_two_nodes_of_one_process_train_and_checkpoint_together(tmp_path, tiny_model, manifest, rft):
    job = manifest("dist", trainer={"maxSteps": STEPS, "nodes": 2, "processesPerNode": 1},
                   checkpoint={"everySteps": STEPS})
    out = tmp_path / "out"
    code = rft.run(["run", str(job), "--out", str(out), "--no-progress"], tmp_path / "run.log")
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert [r["step"] for r in rft.rows(out)] == list(range(1, STEPS + 1))
    # rank 1 ran as its own process and followed rank 0 to the end
    rank_log = out / "logs" / "trainer-rank-1-0.log"
    assert rank_log.is_file()
    ckpt = out / "checkpoints" / f"step-{STEPS:06d}"
    # a distributed checkpoint: one shard file per rank, and the gathered weights
    assert sorted(p.name for p in (ckpt / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (ckpt / "weights.safetensors").is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["spec"]["trainer"]["nodes"] == 2 and cfg["ports"]["rendezvous"] > 0
