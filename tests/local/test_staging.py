"""The file moves of ``rft run`` on a Ray cluster without a shared filesystem (:mod:`rft_runtime.local.staging`),
unit by unit; ``test_ray_cluster.py`` runs them between two real Ray nodes."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from rft_api import runtime
from rft_runtime.local.staging import (
    PIECE_BYTES,
    PIECE_ENV,
    OutputSync,
    changed_outputs,
    input_paths,
    pack,
    pack_pieces,
    piece_bytes_from_env,
    unpack,
    unpack_pieces,
)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_packed_directory_unpacks_the_same_and_rollouts_get_no_weights(tmp_path):
    model = _tree(tmp_path / "model", {"config.json": "{}", "tokenizer.json": "tok", "model.safetensors": "w",
                                        "sub/pytorch_model.bin": "w", "sub/vocab.txt": "v"})
    unpack(pack(model), tmp_path / "full")
    unpack(pack(model, skip_weights=True), tmp_path / "light")
    assert sorted(p.relative_to(tmp_path / "full").as_posix() for p in (tmp_path / "full").rglob("*") if p.is_file()) == [
        "model/config.json", "model/model.safetensors", "model/sub/pytorch_model.bin", "model/sub/vocab.txt",
        "model/tokenizer.json"]
    assert sorted(p.name for p in (tmp_path / "light").rglob("*") if p.is_file()) == ["config.json", "tokenizer.json",
                                                                                     "vocab.txt"]
    one = _tree(tmp_path, {"evaluator.py": "def score(s, i): return 1.0"}) / "evaluator.py"
    unpack(pack(one), tmp_path / "file")
    assert (tmp_path / "file" / "evaluator.py").read_text() == one.read_text()


def test_an_archive_travels_in_pieces_no_larger_than_asked_and_unpacks_as_a_stream(tmp_path):
    """What the object store holds: pieces of at most ``piece_bytes`` that together are the archive
    :func:`pack` makes (same digest); unpacking reads them one after the other."""
    model = _tree(tmp_path / "model", {"config.json": "{}", "tokenizer.json": "t" * 70_000,
                                        "model.safetensors": "w" * 150_000, "sub/vocab.txt": "v"})
    whole = pack(model)
    digest, pieces, size = pack_pieces(lambda tar: tar.add(str(model), arcname="model"), lambda b: b,
                                       piece_bytes=16_384)
    assert b"".join(pieces) == whole and size == len(whole)
    assert len(pieces) == -(-len(whole) // 16_384) > 10 and all(len(p) <= 16_384 for p in pieces)
    assert digest == hashlib.sha256(whole).hexdigest()[:32]
    fetched = []

    def fetch():
        for i, p in enumerate(pieces):
            if i == len(pieces) - 1:  # streamed: the first file is on disk before the last piece is read
                assert (tmp_path / "dest" / "model" / "config.json").exists()
            fetched.append(len(p))
            yield p
    unpack_pieces(fetch(), tmp_path / "dest")
    assert fetched == [len(p) for p in pieces]
    for rel in ("config.json", "tokenizer.json", "model.safetensors", "sub/vocab.txt"):
        assert (tmp_path / "dest" / "model" / rel).read_bytes() == (model / rel).read_bytes(), rel
    # an archive smaller than a piece is one piece
    empty = _tree(tmp_path, {"e/x": ""}) / "e"
    assert len(pack_pieces(lambda tar: tar.add(str(empty), arcname="e"), lambda b: b, piece_bytes=1 << 20)[1]) == 1


@pytest.mark.parametrize("raw", ["64M", "0", "-1", "1.5", "6\u00b2"])
def test_a_piece_size_that_is_not_a_positive_number_of_bytes_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(PIECE_ENV, raw)
    with pytest.raises(ValueError, match=rf"\$RFT_STAGE_PIECE_BYTES must be a positive whole number of bytes, not '{raw}'"):
        piece_bytes_from_env()


def test_the_piece_size_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(PIECE_ENV, raising=False)
    assert piece_bytes_from_env() == PIECE_BYTES
    monkeypatch.setenv(PIECE_ENV, "65536")
    assert piece_bytes_from_env() == 65536


def test_unpack_refuses_an_archive_that_escapes(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        unpack(buf.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escaped").exists()


def test_input_paths_name_every_file_a_role_reads_once(tmp_path):
    paths = runtime.Paths(checkpoints="/ck", model="/m", tokenizer="/t", warm_start="/w", chat_template="/c",
                          datasets=runtime.DatasetPaths(train="/d/train", eval="/d/eval", mix={"x": "/d/x", "y": "/d/train"}),
                          evaluator_files=[runtime.EvaluatorFile(index=0, path="/e/0.py")])
    assert input_paths(paths) == ["/m", "/t", "/w", "/c", "/d/train", "/d/eval", "/d/x", "/e/0.py"]
    assert input_paths(runtime.Paths(checkpoints="/ck", model="builtin:tiny")) == []


def test_outputs_are_mirrored_pruning_included_and_temporary_entries_are_not(tmp_path):
    trainer = _tree(tmp_path / "trainer", {
        "metrics.jsonl": "{}\n", "progress.json": "{}", "tensorboard/events.1": "e",
        "checkpoints/step-000002/COMPLETE": "{}", "checkpoints/step-000002/dcp/.metadata": "m",
        "checkpoints/latest": "step-000002", "checkpoints/weights/v2/model.safetensors": "w",
        "checkpoints/.tmp-step-000004-a0-ab12/partial": "p", "checkpoints/.latest.tmp-1a2b": "t",
        "trainer-config.json": "{}"})
    out = _tree(tmp_path / "out", {"config.json": "driver's own", "logs/trainer.log": "log"})
    sync = OutputSync(out)
    changed, gone, sync.known = changed_outputs(trainer, sync.known)
    assert sorted(changed) == ["checkpoints/latest", "checkpoints/step-000002/COMPLETE",
                               "checkpoints/step-000002/dcp/.metadata", "metrics.jsonl", "progress.json",
                               "tensorboard/events.1"]
    assert gone == []
    sync.apply(changed, gone)
    assert (out / "checkpoints/step-000002/dcp/.metadata").read_text() == "m"
    assert not (out / "checkpoints/weights").exists() and not (out / "trainer-config.json").exists()

    # nothing changed: nothing sent
    changed, gone, known = changed_outputs(trainer, sync.known)
    assert (changed, gone) == ({}, [])
    # the next checkpoint, the old one pruned, a row appended
    _tree(trainer, {"checkpoints/step-000004/COMPLETE": "{}", "checkpoints/latest": "step-000004"})
    os.utime(trainer / "checkpoints/latest", ns=(1, 1))  # a new signature even within the clock's resolution
    (trainer / "metrics.jsonl").write_text("{}\n{}\n")
    for f in ("COMPLETE", "dcp/.metadata"):
        (trainer / "checkpoints/step-000002" / f).unlink()
    changed, gone, sync.known = changed_outputs(trainer, sync.known)
    assert sorted(changed) == ["checkpoints/latest", "checkpoints/step-000004/COMPLETE", "metrics.jsonl"]
    assert sorted(gone) == ["checkpoints/step-000002/COMPLETE", "checkpoints/step-000002/dcp/.metadata"]
    sync.apply(changed, gone)
    assert (out / "checkpoints/latest").read_text() == "step-000004"
    assert not (out / "checkpoints/step-000002").exists()  # emptied directories go too
    assert (out / "metrics.jsonl").read_text() == "{}\n{}\n"
    assert (out / "config.json").read_text() == "driver's own" and (out / "logs/trainer.log").exists()


def test_a_pointer_is_written_after_the_checkpoint_it_names(tmp_path, monkeypatch):
    order: list[str] = []
    sync = OutputSync(tmp_path)
    real_replace = os.replace

    def spy(src, dst):
        order.append(Path(dst).relative_to(tmp_path).as_posix())
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    sync.apply({"checkpoints/latest": b"step-000002", "checkpoints/step-000002/z.bin": b"z",
                "checkpoints/step-000002/COMPLETE": b"{}"}, [])
    assert order[-1] == "checkpoints/latest" and len(order) == 3


def test_errors_name_the_drivers_files_not_a_nodes_copies():
    from rft_runtime.local.staging import Archive, Shipment, driver_paths

    s = Shipment("0123abcd", full={"/home/u/out/mounts/evaluator/0/closeness.py": Archive("closeness.py", "a" * 32, ()),
                                   "/models/qwen": Archive("qwen", "b" * 32, ())},
                 light={"/models/qwen": Archive("qwen", "c" * 32, ())})
    copy = "/tmp/rft-run-0123abcd/inputs/" + "a" * 32 + "/closeness.py"
    text = f"evaluator 'score': '{copy}:score': evaluator file {copy} failed to load"
    assert driver_paths(s, text) == ("evaluator 'score': '/home/u/out/mounts/evaluator/0/closeness.py:score': "
                                     "evaluator file /home/u/out/mounts/evaluator/0/closeness.py failed to load")
    light = "/var/tmp/rft-run-0123abcd/inputs/" + "c" * 32 + "/qwen/tokenizer.json"
    assert driver_paths(s, f"no {light}") == "no /models/qwen/tokenizer.json"
    other = "/tmp/rft-run-ffff0000/inputs/" + "a" * 32 + "/closeness.py"  # another run's: left alone
    assert driver_paths(s, other) == other
