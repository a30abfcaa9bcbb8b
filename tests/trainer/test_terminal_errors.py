"""What no restart can cure ends the trainer with the terminal status 2 and a one-line message giving the
reason the operator fails the job with and naming the field (the pod's Job then fails at once instead of
spending the job's restarts on it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rft_api.job import validate_spec
from rft_runtime.trainer.main import main
from tests.support.runtime_config import local_config


def _config(tmp_path: Path, model_dir: Path, **over: Any) -> str:
    spec: dict[str, Any] = {"model": {"base": str(model_dir)}, "dataset": {"train": {"builtin": "arithmetic"}},
                            "evaluator": {"builtin": "math"}, "trainer": {"maxSteps": 1}}
    spec.update(over)
    cfg = local_config("j", validate_spec(spec), inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "ckpt",
                       output=tmp_path / "out")
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json())
    return str(path)


def test_a_malformed_dataset_row_is_terminal_and_named(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b'{"prompt": "1+1", "ground_truth": "2"}\n{"prompt": 7}\n')
    assert main(["--config", _config(tmp_path, tiny_model_dir, dataset={"train": {"path": str(data)}})]) == 2
    err = capsys.readouterr().err
    assert f"rft trainer: InvalidDataset: {data}:2: field 'prompt' must be a string" in err and "Traceback" not in err


def test_lora_target_modules_the_model_lacks_are_terminal_and_named(tmp_path, tiny_model_dir, capsys):
    lora = {"rank": 4, "alpha": 8, "targetModules": ["no_such_proj"]}
    assert main(["--config", _config(tmp_path, tiny_model_dir, model={"base": str(tiny_model_dir), "lora": lora})]) == 2
    err = capsys.readouterr().err
    assert "rft trainer: ModelLoadFailed: spec.model.lora.targetModules:" in err and "no_such_proj" in err


def test_a_model_transformers_cannot_build_is_terminal_and_named(tmp_path, tiny_model_dir, capsys):
    import shutil

    broken = tmp_path / "model"
    shutil.copytree(tiny_model_dir, broken)
    config = (broken / "config.json").read_text()
    (broken / "config.json").write_text(config.replace('"model_type": "', '"model_type": "no-such-arch-'))
    assert main(["--config", _config(tmp_path, broken)]) == 2
    assert f"rft trainer: ModelLoadFailed: spec.model.base: {broken} cannot be loaded" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _no_signal_handlers(monkeypatch):
    """main() installs SIGTERM/SIGINT handlers for the pod; the test process keeps its own."""
    import signal

    monkeypatch.setattr(signal, "signal", lambda *a, **k: None)
