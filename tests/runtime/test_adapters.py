"""Naming of policy versions served as LoRA adapters (shared by the trainer and the rollout client)."""

from __future__ import annotations

import pytest

from rft_runtime.adapters import adapter_name, adapter_version, serves_adapters
from rft_runtime.trainer.reload import AdapterReload, DiskReload, reload_protocol


def test_names_round_trip_and_foreign_names_are_not_versions():
    for v in (0, 1, 17, 12345):
        assert adapter_version("job", adapter_name("job", v)) == v
    assert adapter_name("vllm-lora", 3) == "vllm-lora-v3"
    # the base model, another job's adapters (also one whose name extends this one), junk
    for name in ("job", "job-v", "job-v01", "job-v-1", "job-vx", "other-v3", "job-v2-v3x", None, 3):
        assert adapter_version("job", name) is None, name
    assert adapter_version("job-v2", "job-v2-v5") == 5 and adapter_version("job", "job-v2-v5") is None
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(ValueError, match="policy version"):
            adapter_name("job", bad)


def test_which_engines_serve_adapters_and_the_protocol_each_gets():
    assert serves_adapters("vllm", "lora")
    assert not serves_adapters("builtin", "lora")  # loads adapters in place, one model name
    assert not serves_adapters("vllm", "none")
    assert isinstance(reload_protocol("builtin", "lora", "j"), DiskReload)
    assert isinstance(reload_protocol("builtin", "disk", "j"), DiskReload)
    vllm = reload_protocol("vllm", "lora", "j")
    assert isinstance(vllm, AdapterReload) and vllm.load_route == "/v1/load_lora_adapter"
