"""/update_weights_from_disk: full checkpoints and LoRA adapters, policy versions, atomic swaps."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from rft_runtime.serve.weights import merge_lora, read_safetensors_dir
from tests.serve.support import CHAT_PROMPT, TINY, recompute_logprobs, start_server
from tests.support import metrics_text

ATOL = 1e-4


def _load(path: Path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    """A perturbed full checkpoint, a LoRA adapter and an rsLoRA adapter with patterns, all on disk."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    model = _load(TINY)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(root / "v1")
    lora = get_peft_model(_load(TINY), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                 target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]))
    lora.save_pretrained(root / "lora")
    rs = get_peft_model(_load(TINY), LoraConfig(r=4, lora_alpha=16, use_rslora=True, init_lora_weights=False,
                                               target_modules=["k_proj", "up_proj", "embed_tokens"],
                                               rank_pattern={"up_proj": 2}, alpha_pattern={"k_proj": 3}))
    rs.save_pretrained(root / "rslora")
    return {"v1": root / "v1", "lora": root / "lora", "rslora": root / "rslora", "root": root}


def _merged_reference(adapter: Path):
    from peft import PeftModel

    return PeftModel.from_pretrained(_load(TINY), adapter).merge_and_unload().eval()


@pytest.mark.parametrize("name", ["lora", "rslora"])
def test_merge_lora_equals_peft_merge(dirs, name):
    ours = merge_lora(read_safetensors_dir(TINY), dirs[name])
    ref = _merged_reference(dirs[name]).state_dict()
    changed = 0
    for key, t in ours.items():
        assert torch.allclose(t, ref[key], atol=1e-6, rtol=0), key
        changed += not torch.equal(t, read_safetensors_dir(TINY)[key])
    assert changed >= 4


@pytest.fixture(scope="module")
def wserver():
    s = start_server(TINY, max_batch_size=8)
    yield s
    s.stop()


def _complete(url: str, **kw) -> httpx.Response:
    body = {"prompt": CHAT_PROMPT, "max_tokens": 12, "temperature": 0.8, "seed": 3, "logprobs": 0,
            "return_token_ids": True, "ignore_eos": True, **kw}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def _update(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/update_weights_from_disk", json=body, timeout=120)


def _max_err(model, choice: dict, temperature: float = 0.8) -> float:
    out = choice["token_ids"]
    ref = recompute_logprobs(model, choice["prompt_token_ids"], out, temperature)
    want = ref[torch.arange(len(out)), torch.tensor(out)]
    return float((torch.tensor(choice["logprobs"]["token_logprobs"]) - want).abs().max())


def test_updates_change_weights_and_bump_versions(wserver, dirs, ref_model):
    url = wserver.url
    assert httpx.get(f"{url}/get_policy_version").json() == {"policy_version": 0}
    r0 = _complete(url)
    assert r0.headers["x-policy-version"] == "0" and r0.json()["policy_version"] == 0
    c0 = r0.json()["choices"][0]

    u = _update(url, model_path=str(dirs["v1"]))
    assert u.status_code == 200, u.text
    assert u.json()["success"] is True and u.json()["policy_version"] == 1 and u.json()["load_format"] == "full"
    r1 = _complete(url)
    assert r1.headers["x-policy-version"] == "1" and r1.json()["policy_version"] == 1
    c1 = r1.json()["choices"][0]
    assert c1["logprobs"]["token_logprobs"] != c0["logprobs"]["token_logprobs"]
    assert _max_err(_load(dirs["v1"]), c1) <= ATOL

    u = _update(url, model_path=str(TINY), policy_version=7)  # back to the base weights, explicit version
    assert u.json()["policy_version"] == 7
    c7 = _complete(url).json()["choices"][0]
    assert c7["token_ids"] == c0["token_ids"]
    assert _max_err(ref_model, c7) <= ATOL

    u = _update(url, model_path=str(dirs["lora"]))
    assert u.status_code == 200 and u.json()["policy_version"] == 8 and u.json()["load_format"] == "lora"
    c8 = _complete(url).json()["choices"][0]
    merged = _merged_reference(dirs["lora"])
    assert _max_err(merged, c8) <= ATOL
    _update(url, model_path=str(dirs["lora"]))  # merged into the base again, not stacked
    c9 = _complete(url).json()
    assert c9["policy_version"] == 9 and c9["choices"][0]["token_ids"] == c8["token_ids"]
    assert _max_err(merged, c9["choices"][0]) <= ATOL
    assert httpx.get(f"{url}/get_policy_version").json() == {"policy_version": 9}
    metrics = httpx.get(f"{url}/metrics").text
    assert metrics_text.value(metrics, "rft_serve_weight_updates_total", result="ok") == 4.0
    assert metrics_text.value(metrics, "rft_serve_policy_version", rft_role="inference") == 9.0


def test_bad_updates_are_refused_and_change_nothing(wserver, dirs, tmp_path):
    url = wserver.url
    version = httpx.get(f"{url}/get_policy_version").json()["policy_version"]
    before = _complete(url).json()["choices"][0]
    base = read_safetensors_dir(TINY)
    bad_shape = tmp_path / "bad_shape"
    bad_shape.mkdir()
    name = "model.layers.0.mlp.up_proj.weight"
    save_file({**base, name: base[name][:-1].contiguous()}, str(bad_shape / "model.safetensors"))
    extra = tmp_path / "extra"
    extra.mkdir()
    save_file({**base, "model.layers.9.mlp.up_proj.weight": base[name].clone()}, str(extra / "model.safetensors"))
    missing = tmp_path / "missing"
    missing.mkdir()
    save_file({k: v for k, v in base.items() if "layers.1." not in k}, str(missing / "model.safetensors"))
    dora = tmp_path / "dora"
    dora.mkdir()
    cfg = json.loads((dirs["lora"] / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    cases = [({"model_path": str(tmp_path / "nope")}, "not a directory"), ({"model_path": str(bad_shape)}, "shape"),
             ({"model_path": str(extra)}, "unexpected"), ({"model_path": str(missing)}, "missing"),
             ({"model_path": str(dora)}, "DoRA"), ({}, "model_path"), ({"model_path": str(TINY), "policy_version": -1},
                                                                       "policy_version"),
             ({"model_path": str(tmp_path)}, "no *.safetensors")]
    for body, words in cases:
        r = _update(url, **body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["success"] is False and words in r.json()["message"], r.json()
        assert r.json()["policy_version"] == version
    after = _complete(url).json()
    assert after["policy_version"] == version
    assert after["choices"][0]["token_ids"] == before["token_ids"]


async def test_concurrent_requests_see_one_set_of_weights(wserver, dirs, ref_model):
    """Requests in flight during an update finish on the old weights; later ones run on the new."""
    url = wserver.url
    _update(url, model_path=str(TINY), policy_version=100)
    models = {100: ref_model, 101: _load(dirs["v1"])}
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        async def gen(seed: int) -> dict:
            body = {"prompt": CHAT_PROMPT[: 10 + seed], "max_tokens": 30, "temperature": 0.8, "seed": seed,
                    "logprobs": 0, "return_token_ids": True, "ignore_eos": True}
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200
            assert r.headers["x-policy-version"] == str(r.json()["policy_version"])
            return r.json()

        early = [asyncio.ensure_future(gen(s)) for s in range(6)]
        for _ in range(1000):  # wait until some are being decoded (no timing assumption beyond a deadline)
            if wserver.engine.num_running:
                break
            await asyncio.sleep(0.005)
        assert wserver.engine.num_running
        upd = asyncio.ensure_future(c.post("/update_weights_from_disk", json={"model_path": str(dirs["v1"])}))
        await asyncio.sleep(0.01)
        middle = [asyncio.ensure_future(gen(s)) for s in range(6, 9)]
        u = await upd
        assert u.status_code == 200 and u.json()["policy_version"] == 101
        late = [await gen(s) for s in range(9, 11)]
        results = await asyncio.gather(*early) + await asyncio.gather(*middle) + late
    versions = [r["policy_version"] for r in results]
    assert set(versions) <= {100, 101}
    assert 100 in versions[:6]  # those running when the update arrived finished on the old weights
    assert all(v == 101 for v in versions[-2:])
    for r in results:  # each completion is entirely explained by the weights of its reported version
        assert _max_err(models[r["policy_version"]], r["choices"][0]) <= ATOL


def _archive(path: Path, top: str | None = None) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(path), arcname=top or path.name)
    return buf.getvalue()


def test_weights_uploaded_as_an_archive_are_served(wserver, dirs, caplog):
    """/update_weights_from_archive: the trainer that shares no filesystem with the server
    (``trainer.weightTransfer: http``) uploads the directory; the server serves exactly those
    weights under the given version, and keeps no copy."""
    import tempfile

    from rft_runtime.trainer.publisher import WeightPublisher
    from rft_runtime.trainer.reload import ArchiveReload

    caplog.set_level("INFO", logger="rft_runtime.serve.routes")
    url = wserver.url
    leftovers = set(Path(tempfile.gettempdir()).glob("rft-weights-*"))
    pub = WeightPublisher(dirs["root"], [url], protocol=ArchiveReload(), deadline_s=60)
    assert pub.load(dirs["v1"], 21) == [url]  # the publisher's own check: the server reports 21
    c = _complete(url).json()
    assert c["policy_version"] == 21
    assert _max_err(_load(dirs["v1"]), c["choices"][0]) <= ATOL
    assert set(Path(tempfile.gettempdir()).glob("rft-weights-*")) == leftovers
    assert "serving policy version 21 (full weights)" in caplog.text


def test_bad_archives_are_refused_and_change_nothing(wserver, dirs, tmp_path):
    import io
    import tarfile

    url = wserver.url
    version = httpx.get(f"{url}/get_policy_version").json()["policy_version"]
    escape = io.BytesIO()
    with tarfile.open(fileobj=escape, mode="w") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    two = io.BytesIO()
    with tarfile.open(fileobj=two, mode="w") as tar:
        tar.add(str(dirs["v1"]), arcname="a")
        tar.add(str(dirs["v1"]), arcname="b")
    (tmp_path / "empty").mkdir()
    cases = [(b"not a tar archive", "not a usable tar archive"), (escape.getvalue(), "not a usable tar archive"),
             (two.getvalue(), "one top directory"), (_archive(tmp_path / "empty"), "no *.safetensors")]
    for body, words in cases:
        r = httpx.post(f"{url}/update_weights_from_archive?policy_version=30", content=body, timeout=60)
        assert r.status_code == 400, (words, r.text)
        assert r.json()["success"] is False and words in r.json()["message"], r.json()
    r = httpx.post(f"{url}/update_weights_from_archive?policy_version=-2", content=_archive(dirs["v1"]), timeout=60)
    assert r.status_code == 400 and "policy_version" in r.json()["message"]
    assert not (tmp_path.parent / "outside.txt").exists()
    assert httpx.get(f"{url}/get_policy_version").json()["policy_version"] == version


def test_an_archive_over_the_cap_is_refused():
    small = start_server(TINY, max_upload_bytes=64 << 10)
    try:
        r = httpx.post(f"{small.url}/update_weights_from_archive", content=_archive(TINY), timeout=60)
        assert r.status_code == 413 and "cap of 65536 bytes" in r.json()["message"], r.text
        assert httpx.get(f"{small.url}/get_policy_version").json()["policy_version"] == 0
    finally:
        small.stop()


def test_a_compressed_archive_or_one_that_unpacks_over_the_cap_is_refused_before_writing(tmp_path):
    """The audit's probe: a 204 KB gzip upload that unpacks to 200 MiB. Compressed archives are not
    read at all, and an uncompressed one is refused when what it would unpack exceeds the cap (checked
    from its headers before anything is written), whatever its upload size."""
    import io
    import subprocess
    import tarfile
    import tempfile

    small = start_server(TINY, max_upload_bytes=256 << 10)
    try:
        bomb = io.BytesIO()
        with tarfile.open(fileobj=bomb, mode="w:gz") as tar:
            info = tarfile.TarInfo("w/zeros.safetensors")
            info.size = 200 << 20
            tar.addfile(info, io.BytesIO(bytes(info.size)))
        assert len(bomb.getvalue()) < 256 << 10
        leftovers = set(Path(tempfile.gettempdir()).glob("rft-weights-*"))
        r = httpx.post(f"{small.url}/update_weights_from_archive", content=bomb.getvalue(), timeout=60)
        assert r.status_code == 400 and "uncompressed" in r.json()["message"], r.text
        # a GNU sparse member: 10 KiB of archive that unpacks to 200 MiB
        (tmp_path / "w").mkdir()
        with open(tmp_path / "w" / "big.safetensors", "wb") as f:
            f.truncate(200 << 20)
        sparse = tmp_path / "sparse.tar"
        subprocess.run(["tar", "--sparse", "-C", str(tmp_path), "-cf", str(sparse), "w"], check=True)
        assert sparse.stat().st_size < 64 << 10
        r = httpx.post(f"{small.url}/update_weights_from_archive", content=sparse.read_bytes(), timeout=60)
        assert r.status_code == 400 and f"unpacks to {200 << 20} bytes, more than the server's cap of " \
            f"{256 << 10}" in r.json()["message"], r.text
        assert set(Path(tempfile.gettempdir()).glob("rft-weights-*")) == leftovers
        assert httpx.get(f"{small.url}/get_policy_version").json()["policy_version"] == 0
    finally:
        small.stop()


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors", ".."])
def test_a_safetensors_index_cannot_name_a_file_outside_the_weights_directory(tmp_path, shard):
    import json

    from rft_runtime.serve.errors import WeightLoadError
    from rft_runtime.serve.weights import read_safetensors_dir

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(WeightLoadError, match="not a file name in the weights directory"):
        read_safetensors_dir(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(WeightLoadError, match="not a safetensors index"):
        read_safetensors_dir(tmp_path)
