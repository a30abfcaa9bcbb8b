"""The trainer's torch.distributed side: process group, device, FSDP2 sharding, row shards.

Every trainer process — ``spec.trainer.nodes × processesPerNode`` of them, 1 included — is one
rank of one process group (gloo on CPU, NCCL on GPUs; one code path for every world size). The
global rank of a process is ``node × processesPerNode + local rank``; the node is the pod's
``JOB_COMPLETION_INDEX`` (0 on one machine). Rank 0 reaches the others through a TCP store at
``trainer.masterAddress:ports.rendezvous`` (the headless trainer Service in pods, loopback locally).

The policy and the reference are sharded with FSDP2 (:func:`torch.distributed.fsdp.fully_shard`:
each decoder layer, then the root) over two ranks or more. One rank keeps a plain module: its shard
would be the whole parameter, and FSDP2 would only copy, cast and hook (the same checkpoints: DCP
reshards them to any world size). On a GPU with ``model.dtype: auto`` parameters stay float32 (the
master weights, and AdamW's state) and the forward and backward compute in bfloat16: under FSDP2 by
its ``MixedPrecisionPolicy`` (gradients reduced in float32), at world size 1 by ``torch.autocast``
around the model's forward, as Accelerate runs TRL (matrix products in bfloat16, the residual stream,
norms and softmax in float32). Log-probabilities and the loss are always computed in float32. On the
CPU everything is float32.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist

from . import attention

log = logging.getLogger(__name__)

NODE_ENV = "JOB_COMPLETION_INDEX"
"""The node (pod) index: set by Kubernetes in every pod of an Indexed Job."""

GROUP_TIMEOUT_S = 7 * 24 * 3600.0
"""How long a collective may wait. Ranks other than 0 wait in a broadcast for as long as rank 0
collects a step's episodes (no bound: the stall timeout only bounds the time between two episodes),
so this is not how a dead rank is noticed: gloo sees its connections close, and a failed trainer pod
fails the Job, whose pods the operator replaces as a group."""


@dataclass(frozen=True)
class DistContext:
    """Where this trainer process stands in the process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_address: str = "127.0.0.1"
    port: int = 0
    """The rendezvous port (0 with a world size of 1: an in-process store, no port)."""
    timeout_s: float = GROUP_TIMEOUT_S
    cpu_offload: bool = False
    """``trainer.cpuOffload``: the sharded parameters, gradients and optimizer state stay in host memory
    (:func:`fsdp`); the model is sharded with FSDP2 at every world size."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"trainer rank {self.rank} is outside the world size {self.world_size}")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """``cuda:<local rank>`` when this machine has GPUs, else the CPU."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    @property
    def backend(self) -> str:
        """gloo on the CPU, NCCL on GPUs; with :attr:`cpu_offload` on GPUs both (the offloaded gradients'
        norm is reduced on the host)."""
        if self.device.type != "cuda":
            return "gloo"
        return "cpu:gloo,cuda:nccl" if self.cpu_offload else "nccl"

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded with FSDP2: over two ranks or more, or to offload it."""
        return self.world_size > 1 or self.cpu_offload

    @property
    def storage_device(self) -> torch.device:
        """Where the sharded parameters live: the host with :attr:`cpu_offload`, else :attr:`device`."""
        return torch.device("cpu") if self.cpu_offload else self.device


def context_for(cfg: Any, local_rank: int = 0, node: int | None = None, port: int | None = None) -> DistContext:
    """The :class:`DistContext` of local process ``local_rank`` of ``node`` (default: ``$JOB_COMPLETION_INDEX``
    or 0) under the runtime contract ``cfg``."""
    t = cfg.spec.trainer
    if node is None:
        node = int(os.environ.get(NODE_ENV, "0") or 0)
    procs = t.processes()
    if not 0 <= node < t.nodes:
        raise ValueError(f"trainer node {node} is outside trainer.nodes {t.nodes}")
    return DistContext(rank=node * procs + local_rank, world_size=t.world_size(), local_rank=local_rank,
                       master_address=cfg.trainer.master_address,
                       port=cfg.ports.rendezvous if port is None else port, cpu_offload=bool(t.cpu_offload))


def ensure_group(ctx: DistContext) -> None:
    """Join (or create) the process group of ``ctx``; a no-op when this process already has one of
    its size (several trainers one after another in one process, as tests do)."""
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    if dist.is_initialized():
        if dist.get_world_size() != ctx.world_size or dist.get_rank() != ctx.rank:
            raise RuntimeError(f"this process is rank {dist.get_rank()} of {dist.get_world_size()}, "
                               f"the trainer wants rank {ctx.rank} of {ctx.world_size}")
        return
    timeout = datetime.timedelta(seconds=ctx.timeout_s)
    kw: dict[str, Any] = {"device_id": ctx.device} if ctx.device.type == "cuda" else {}
    if ctx.world_size == 1:
        dist.init_process_group(ctx.backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **kw)
    else:
        dist.init_process_group(ctx.backend, init_method=f"tcp://{ctx.master_address}:{ctx.port}",
                                rank=ctx.rank, world_size=ctx.world_size, timeout=timeout, **kw)
    log.info("rank %d of world size %d joined the process group (%s, device %s)", ctx.rank, ctx.world_size,
             ctx.backend, ctx.device)


def leave_group() -> None:
    """Leave the process group together: a barrier (no rank tears its connections down while another
    still uses them), then destroy it. Collective."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a (possibly peft-wrapped) Hugging Face model: its
    ``_no_split_modules`` classes."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model: torch.nn.Module, ctx: DistContext, compute_dtype: torch.dtype | None = None,
          compile_layers: bool = False) -> torch.nn.Module:
    """Move ``model`` to this rank's device and shard it over every rank (:func:`fsdp`). One rank has
    nothing to shard: the model stays a plain module, computing in ``compute_dtype`` under autocast
    (:func:`autocast_forward`) when that is given. On the CPU (the 4-layer float32 model of
    ``bench/trainer_vs_trl.py``) a step is 6-7 % faster than under FSDP2; with bfloat16 compute on a
    model of 24 small layers (``--bf16 --hidden 64 --layers 24``: bound by per-operation overhead, as a
    GPU is by launches) it takes 19 % less time than FSDP2's mixed precision (docs/trainer.md).

    ``compile_layers``: each decoder layer's forward is compiled first (:mod:`.compiled`). On the CPU with a
    lower-precision compute dtype, attention runs in float32 (:mod:`.attention`)."""
    if attention.applies(ctx.device, compute_dtype):
        attention.use_float32_attention(model)
    if compile_layers:
        from .compiled import compile_blocks

        log.info("compiling %d decoder layers (torch.compile, dynamic shapes)", compile_blocks(_blocks(model)))
    if not ctx.sharded:
        model = model.to(ctx.device)
        return autocast_forward(model, compute_dtype) if compute_dtype is not None else model
    return fsdp(model, ctx, compute_dtype)


def autocast_forward(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Run ``model``'s forward under ``torch.autocast(dtype)`` on its device (its parameters keep their
    dtype; the autograd graph casts the gradients back to it). Returns ``model``."""
    device = next(model.parameters()).device
    model.forward = torch.autocast(device.type, dtype=dtype)(model.forward)
    return model


def fsdp(model: torch.nn.Module, ctx: DistContext, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Move ``model`` to this rank's device and shard it with FSDP2 over every rank (each block, then
    the root). ``compute_dtype`` (bfloat16 on GPUs) is FSDP's parameter dtype in forward/backward;
    the stored (master) parameters keep their dtype and gradients are reduced in float32. A model
    whose parameters are on the meta device stays there (sharded, without storage): each rank then
    allocates and reads its own shards (:func:`.sharded_load.materialise`).

    With ``ctx.cpu_offload`` (FSDP2's ``CPUOffloadPolicy``) the shards, their gradients and so the
    optimizer's state stay on the host: the model is not moved to the device first (FSDP2 moves each
    block's parameters there as it shards it, then back), and each block's parameters are copied to the
    device for its forward and backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not ctx.cpu_offload and not any(p.is_meta for p in model.parameters()):
        model.to(ctx.device)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    # Resharding after the forward frees the gathered (and cast) parameters until the backward gathers
    # them again. With one rank the shard is the whole parameter: that saves only the compute-dtype copy
    # and costs a second gather and cast of every block per micro-batch (on an H200, 365M parameters, bf16
    # compute: 0.57 s per step instead of 0.66 s, for 0.7 GB more memory). Offloaded, the gathered copy is
    # what the device must not keep.
    kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": ctx.world_size > 1 or ctx.cpu_offload}
    if compute_dtype is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    if ctx.cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
    blocks = _blocks(model)
    for block in blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    if ctx.cpu_offload:
        log.info("CPU offload: the parameters, gradients and optimizer state of %d decoder layers and the root "
                 "stay on the host (FSDP2 CPUOffloadPolicy), computing on %s", len(blocks), ctx.device)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state gathered to CPU on rank 0 (an empty dict on the others). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return cast("dict[str, torch.Tensor]",
                get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))


def broadcast(obj: Any = None) -> Any:
    """``obj`` of rank 0 on every rank (pickled). Collective."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order. Collective."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def row_shard(n: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of an ``n``-row batch: (row indices, live flags), padded to ``ceil(n / world)``
    rows on every rank so all ranks run the same number of forward/backward passes (FSDP's
    collectives). Padding rows repeat row 0 and are not live (masked out of everything)."""
    per = max(-(-n // world_size), 1)
    start = rank * per
    rows = list(range(start, min(start + per, n)))
    live = [True] * len(rows) + [False] * (per - len(rows))
    rows += [0] * (per - len(rows))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(live, dtype=torch.bool)


def reshard(model: torch.nn.Module) -> None:
    """Free the gathered (unsharded) parameters of every FSDP2 module of ``model`` after a forward
    pass without gradient. The root module keeps its parameters gathered after a forward, expecting
    the backward to follow; after a ``no_grad`` forward none does, and a training forward that starts
    from those parameters computes wrong gradients for the root's own parameters (the embeddings, the
    final norm, a tied output layer): on a tiny model the step's gradient norm came out 1.09 instead
    of 1.80. A no-op on a model that is not sharded."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def gather_rows(local: torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
    """Concatenate every rank's ``[per, ...]`` rows (see :func:`row_shard`) into the ``[n, ...]`` whole
    on every rank (CPU). Collective."""
    world = dist.get_world_size()
    t = local.to(device).contiguous()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    return torch.cat([p.cpu() for p in parts])[:n]

