"""Building a model on the meta device and loading each rank's shards straight from safetensors.

Over two ranks or more the policy and the reference are built from their ``config.json`` with their
parameters on the meta device (no memory), sharded with FSDP2 (:func:`~.distributed.fsdp`), then each
rank allocates only its own shards (``to_empty``) and reads into them only its rows of each tensor
(safetensors' ``get_slice``): a rank never holds more than its shard plus one tensor's slice, and peak
memory per rank falls with 1/N of the parameters. Buffers (rotary ``inv_freq``) are not in checkpoints:
they are built on the CPU with the model, as ``from_pretrained`` builds them, and copied in. Tied
embeddings are re-tied after ``to_empty``. Checkpoint values are cast to the parameter dtype as
``from_pretrained(dtype=...)`` casts them, so the loaded shards equal the slices of the plain model.

:func:`plan` reads only the safetensors headers and says which file holds each parameter; it returns
None where this loader does not apply (no safetensors, keys the model does not name as
``from_pretrained`` would, a LoRA adapter to initialise) and the caller loads the model whole.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_FILE = "model.safetensors"


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within it, every parameter a module registers lands on the meta device (no storage); buffers
    are built where they would be, with their values (rotary frequencies are computed, not loaded)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        p = module._parameters[name]
        if p is not None and p.device.type != "meta":
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def checkpoint_files(directory: Path) -> dict[str, Path] | None:
    """Which safetensors file of ``directory`` holds each tensor (from the index, or the one file's
    header); None when the directory has no safetensors weights."""
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    one = directory / SAFETENSORS_FILE
    if not one.is_file():
        return None
    return dict.fromkeys(tensor_names(one), one)


def tensor_names(path: Path) -> list[str]:
    """The tensor names in one safetensors file (its header only)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


@dataclass(frozen=True)
class LoadPlan:
    """Where each parameter and persistent buffer of the model comes from."""

    config_dir: Path
    sources: dict[str, Path]
    """state-dict key → the safetensors file holding it (tied copies excluded)."""


def plan(model_dir: Path, warm_start_from: str | None = None) -> LoadPlan | None:
    """The files to read the model of ``model_dir`` (or its warm start, as
    :func:`~.model_io.load_base` reads it) from, or None where this loader does not apply. A warm start
    without ``config.json`` is one of our checkpoints (``weights.safetensors``): its tensors first, the
    model directory's for the rest."""
    from .state import WEIGHTS_FILE

    src = Path(warm_start_from) if warm_start_from else model_dir
    if warm_start_from and not (src / "config.json").exists():
        weights = src / WEIGHTS_FILE
        base = checkpoint_files(model_dir)
        if not weights.is_file() or base is None:
            return None
        return LoadPlan(model_dir, {**base, **dict.fromkeys(tensor_names(weights), weights)})
    files = checkpoint_files(src)
    return None if files is None else LoadPlan(src, files)


def build_on_meta(config_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The causal LM of ``config_dir/config.json``, parameters on the meta device, buffers computed,
    in eval mode like ``from_pretrained``'s."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Every state-dict key whose parameter is another key's (tied embeddings): copy → first name."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def missing(model: torch.nn.Module, lp: LoadPlan) -> list[str]:
    """The model's state-dict keys (tied copies aside) no file of ``lp`` holds."""
    tied = tied_names(model)
    return [k for k in model.state_dict() if k not in tied and k not in lp.sources]


def materialise(model: torch.nn.Module, lp: LoadPlan, device: torch.device,
                buffer_device: torch.device | None = None) -> torch.nn.Module:
    """Allocate this rank's shards of the (FSDP2-sharded, meta) ``model`` on ``device`` and read them
    from the files of ``lp``; buffers back from the CPU (onto ``buffer_device``, default ``device``: the
    compute device where the shards stay on the host), tied parameters tied again. Returns ``model``."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers() if b.device.type != "meta"}
    tied = tied_names(model)
    model.to_empty(device=device)
    if buffer_device is not None and buffer_device != device:
        for m in model.modules():
            for name, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[name] = b.to(buffer_device)
    for copy, name in tied.items():
        _set_parameter(model, copy, model.get_parameter(name))
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in buffers:
                b.copy_(buffers[name])
        load_shards(model, lp, tied)
    return model


def _set_parameter(model: torch.nn.Module, name: str, param: torch.nn.Parameter) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(model.get_submodule(owner), attr, param)


def load_shards(model: torch.nn.Module, lp: LoadPlan, tied: dict[str, str]) -> None:
    """Copy into every parameter and persistent buffer of ``model`` its local rows from the files of
    ``lp``: for a sharded (DTensor) parameter only this rank's rows of the tensor are read."""
    from safetensors import safe_open

    state = {k: v for k, v in model.state_dict().items() if k not in tied}
    by_file: dict[Path, list[str]] = {}
    for k in state:
        by_file.setdefault(lp.sources[k], []).append(k)
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                _copy_local(state[name], f.get_slice(name))


def _copy_local(target: torch.Tensor, src: Any) -> None:
    """Read into ``target`` (a DTensor's local shard, or a plain tensor) its rows of the stored
    tensor ``src`` (a safetensors slice)."""
    from torch.distributed.tensor import DTensor

    if isinstance(target, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
        local = target.to_local()
        if local.numel() == 0:
            return
        index = tuple(slice(o, o + s) for o, s in zip(offset, shape))
        local.copy_(src[index])
        return
    target.copy_(src[:])


def load_sharded(model_dir: Path, dtype: torch.dtype, warm_start: str | None, ctx: Any,
                 compute: torch.dtype | None = None, compile_layers: bool = False,
                 frozen: bool = False) -> torch.nn.Module | None:
    """The model of ``model_dir`` (weights from ``warm_start`` as :func:`~.model_io.load_base` takes
    them), FSDP2-sharded over the process group of ``ctx`` (:func:`~.distributed.shard`), each rank
    holding and having read only its shards; ``frozen``: no parameter requires a gradient (the
    reference). None at world size 1 (one shard is the whole model: ``from_pretrained`` already builds
    it on the meta device and reads it tensor by tensor) and where :func:`plan` does not apply."""
    from .distributed import shard

    if ctx.world_size == 1:
        return None
    lp = plan(model_dir, warm_start)
    if lp is None:
        log.info("%s has no safetensors weights: every rank loads the whole model before sharding", model_dir)
        return None
    model = build_on_meta(lp.config_dir, dtype)
    gone = missing(model, lp)
    if gone:
        log.info("the checkpoint does not name %d of the model's tensors (%s): every rank loads the whole "
                 "model before sharding", len(gone), ", ".join(gone[:3]))
        return None
    model.config.use_cache = False  # type: ignore[union-attr]
    if frozen:
        for p in model.parameters():
            p.requires_grad_(False)
    model = shard(model, ctx, compute, compile_layers)
    materialise(model, lp, ctx.storage_device, ctx.device)
    log.info("built %s on the meta device and read this rank's shards from %d safetensors file(s)",
             lp.config_dir, len(set(lp.sources.values())))
    return model
