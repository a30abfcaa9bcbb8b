"""The policy update: log-probabilities, loss over micro-batches, optimiser step.

One call of :meth:`Learner.update` is one training step's update: ``epochs`` passes over the
batch; each pass accumulates gradients over micro-batches and ends with one optimiser step. The
loss of each micro-batch is divided by the GLOBAL normaliser of the aggregation mode (computed
once over the whole batch, :func:`~rft_runtime.algos.compute_global_normaliser`), so the
accumulated gradient equals the gradient of the whole batch in one piece (1×8 equals 8×1).

Per micro-batch: ``logprobs_from_logits(logits / T)`` → policy loss (registry) → × TIS weights
(when configured) → + KL to the reference (when ``kl.placement == "loss"``) → aggregation → backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..algos import (
    PolicyLossConfig,
    aggregate_loss,
    compute_global_normaliser,
    compute_policy_loss,
    entropy_from_logits,
    kl_in_loss,
    logprobs_from_logits,
)
from .batch import TrainBatch
from .finite import NonFiniteWeights
from .prefix import StepPrompts, model_costs, order_rows, prompt_owners, shared_logits, shares, step_prompts


@dataclass(frozen=True)
class LearnerConfig:
    """What the update needs from the resolved algorithm and the trainer spec."""

    policy_loss: str = "ppo_clip"
    loss_aggregation: str = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_placement: str = "loss"
    epochs: int = 1
    micro_batch_size: int = 8
    temperature: float = 1.0
    grad_clip: float = 1.0
    max_response_tokens: int = 256
    gradient_checkpointing: bool = False
    """Checkpoint every decoder layer's activations (``trainer.gradientCheckpointing``, :mod:`.checkpointing`)."""
    sequence_packing: bool = False
    """Run each micro-batch's rows packed into one sequence (``trainer.sequencePacking``, :mod:`.packing`)."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"trainer.epochsPerStep must be >= 1, got {self.epochs}")
        if self.micro_batch_size < 1:
            raise ValueError(f"trainer.microBatchSize must be >= 1, got {self.micro_batch_size}")
        if not self.temperature > 0:
            raise ValueError(f"rollout.temperature must be > 0, got {self.temperature}")

    @property
    def kl_in_loss(self) -> bool:
        return self.kl_coef > 0 and self.kl_placement == "loss"

    def policy_loss_config(self) -> PolicyLossConfig:
        return PolicyLossConfig(self.clip_low, self.clip_high, self.dual_clip_c)


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``p`` (a DTensor's local shard under FSDP, else ``p``)."""
    to_local = getattr(p, "to_local", None)
    return to_local().detach() if to_local is not None else p.detach()


def model_device(model: torch.nn.Module) -> torch.device:
    """The device ``model`` computes on: where its parameters live, or, for parameters FSDP2 keeps on the
    host (``trainer.cpuOffload``), their mesh's device."""
    p = next(model.parameters())
    mesh = getattr(p, "device_mesh", None)
    if mesh is None or mesh.device_type == p.device.type:
        return p.device
    return torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" \
        else torch.device(mesh.device_type)


def response_start(loss_mask: torch.Tensor) -> int:
    """The first target column [B, W] that any row trains on (``W - 1`` when none does)."""
    cols = loss_mask.any(0).nonzero()
    return int(cols[0]) if len(cols) else max(loss_mask.shape[1] - 1, 0)


def forward_logits(model: torch.nn.Module, batch: TrainBatch, collective: bool = False,
                   step: tuple[StepPrompts, int] | None = None, packed: bool = False) -> tuple[torch.Tensor, int]:
    """``(logits, start)``: the logits [B, W - start] predicting ``batch.targets[:, start:]``, where
    ``start`` is :func:`response_start` of the batch's loss mask, in float32 whatever the compute dtype
    (log-probs and the loss are float32 math), on the model's device.

    The output layer runs only from the first response token of any row on (the model's
    ``logits_to_keep``): no logits, float32 copies, log-softmax or entropy for the prompt positions
    before it, which no loss reads. With a real vocabulary (150k) the prompt's logits would be most
    of the step's memory. Rows that share a prompt run it once (:mod:`.prefix`; ``collective``: the
    model is sharded over several ranks, which must run the same number of forward passes; ``step``:
    the batch is micro-batch ``k`` of a pass whose prompts :class:`~.prefix.StepPrompts` runs).

    Whole rows run without an attention mask: :func:`~.batch.collate` pads every row on the right and
    the model is causal, so a real position never sees a padding one, and its logits are those the
    padded mask gives. Without a mask, attention takes its causal kernel instead of a masked one (on
    an H200, 8 % of a 365 M-parameter model's step); the padding positions' own logits are never
    read.

    ``packed``: the rows run packed into one sequence without padding (:mod:`.packing`), never shared."""
    dev = model_device(model)
    start = response_start(batch.loss_mask)
    if packed:
        from .packing import packed_logits

        logits = packed_logits(model, batch, start, dev)
        if logits is not None:
            return logits, start
        step = None
    if step is not None:
        prompts, k = step
        plan, run = prompts.plans[k], prompts.run(k, model, dev)
    else:
        plan = prompt_owners(batch, collective, model_costs(model)) if shares(dev, model) and not packed else None
        run = None
    if plan is not None:
        return shared_logits(model, batch, start, plan, dev, collective, run), start
    keep = batch.input_ids.shape[1] - start
    out = model(input_ids=batch.input_ids.to(dev), attention_mask=None, use_cache=False, logits_to_keep=keep)
    return out.logits[:, :-1].float(), start


def micro_batches(n: int, size: int, order: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Index chunks of ``size`` over ``n`` rows (in ``order`` when given)."""
    idx = order if order is not None else torch.arange(n)
    return [idx[i : i + size] for i in range(0, n, size)]


@dataclass(frozen=True)
class Shard:
    """This process's part of a step's batch: rank ``rank`` of ``world_size`` (see
    :func:`~.distributed.row_shard`). Without a shard a call works on the whole batch alone."""

    rank: int
    world_size: int


@torch.no_grad()
def sequence_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float,
                      micro_batch_size: int, shard: Shard | None = None, packing: bool = False) -> torch.Tensor:
    """Log-probabilities [B, L-1] (float32, CPU) of every target token under ``model`` (0 off-mask).

    With ``shard`` every rank computes its rows and the whole is gathered on every rank (collective).
    ``packing``: each micro-batch's rows run packed into one sequence (:mod:`.packing`)."""
    was_training = model.training
    model.eval()
    if shard is None:
        rows, live = torch.arange(batch.size), torch.ones(batch.size, dtype=torch.bool)
    else:
        from .distributed import row_shard

        rows, live = row_shard(batch.size, shard.rank, shard.world_size)
    dev = model_device(model)
    out = torch.zeros((len(rows), batch.loss_mask.shape[1]), dtype=torch.float32, device=dev)
    try:
        collective = shard is not None and shard.world_size > 1
        share = shares(dev, model) and not packing
        order = order_rows(batch, rows, micro_batch_size, share, model_costs(model))
        parts = micro_batches(len(rows), micro_batch_size, order)
        mbs = [batch.select(rows[pos]) for pos in parts]
        prompts = step_prompts(model, batch, mbs, micro_batch_size, dev, collective) if share else None
        for k, (pos, mb) in enumerate(zip(parts, mbs)):
            logits, start = forward_logits(model, mb, collective, (prompts, k) if prompts else None, packing)
            lp = logprobs_from_logits(logits, mb.targets[:, start:].to(dev), temperature).float()
            w = mb.loss_mask.shape[1]
            keep = (mb.loss_mask.to(dev) & live[pos].to(dev).unsqueeze(-1))[:, start:]
            out[pos.to(dev), start:w] = torch.where(keep, lp, torch.zeros_like(lp))
            if prompts is not None:
                prompts.finished(k)
    finally:
        model.train(was_training)
        from .distributed import reshard

        reshard(model)  # a training forward must not start from parameters gathered without gradient
    return whole_batch(out, batch.size, shard, dev)


def whole_batch(rows: torch.Tensor, size: int, shard: Shard | None, device: torch.device) -> torch.Tensor:
    """This rank's ``rows`` (per row of a batch of ``size``) as the whole batch's on the CPU: the rows
    themselves without a shard, else gathered from every rank (collective)."""
    if shard is None:
        return rows.cpu()
    from .distributed import gather_rows

    return gather_rows(rows, size, device)


def forward_is_deterministic(model: torch.nn.Module) -> bool:
    """Whether ``model``'s training forward computes what its evaluation forward does: no dropout with
    a positive rate (modules, LoRA's included, or the attention's ``config.attention_dropout``)."""
    if float(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0) > 0:
        return False
    return not any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


class _Mean:
    """Token-weighted running means of metric tensors. The sums stay tensors on the metrics' device
    until :meth:`to_host` (one read for all of them): adding a micro-batch's metrics never waits for
    the device."""

    def __init__(self) -> None:
        self.sums: dict[str, Any] = {}
        self.weights: dict[str, float] = {}

    def add(self, metrics: dict[str, torch.Tensor], weight: float, prefix: str = "") -> None:
        for k, v in metrics.items():
            key = prefix + k
            term = v.detach().float() * weight if isinstance(v, torch.Tensor) else float(v) * weight
            self.sums[key] = self.sums.get(key, 0.0) + term
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def to_host(self) -> "_Mean":
        """The sums as floats (in place; returns self)."""
        keys = [k for k, v in self.sums.items() if isinstance(v, torch.Tensor)]
        if keys:
            values = torch.stack([self.sums[k].reshape(()) for k in keys]).cpu().tolist()
            self.sums.update(zip(keys, values))
        return self

    def result(self) -> dict[str, float]:
        self.to_host()
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}

    @classmethod
    def merge(cls, parts: list["_Mean"]) -> "_Mean":
        """The running means of several ranks' parts together."""
        out = cls()
        for part in parts:
            for k, v in part.sums.items():
                out.sums[k] = out.sums.get(k, 0.0) + v
                out.weights[k] = out.weights.get(k, 0.0) + part.weights[k]
        return out


@dataclass
class _Update:
    """One :meth:`Learner.update` call: its inputs as every micro-batch reads them, and the log-probs
    it keeps (``own``: the policy's from the update's own forward, when no old log-probs are given)."""

    batch: TrainBatch
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    tis_weights: torch.Tensor | None
    mask: torch.Tensor  # [B, L-1] the loss mask without the invalid rows (host)
    norm: float  # the aggregation's global normaliser over the whole batch
    pl_cfg: PolicyLossConfig
    world: int
    rows: torch.Tensor  # this rank's rows of the batch (padded: see `live`)
    live: torch.Tensor  # [len(rows)] whether each is a real row
    dev: torch.device
    own: torch.Tensor | None  # [len(rows), L-1] float32 on dev


class Learner:
    """Owns the policy, its optimiser and scheduler; computes log-probs and applies updates."""

    def __init__(self, model: torch.nn.Module, cfg: LearnerConfig, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, shard: Shard | None = None) -> None:
        if cfg.gradient_checkpointing:
            from .checkpointing import enable

            enable(model)
        self.model = model
        self.cfg = cfg
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.shard = shard
        """This rank's part of every batch (None: the whole batch, no process group needed)."""
        self.update_logprobs: torch.Tensor | None = None
        """After an :meth:`update` given no old log-probs: the policy's log-probs [B, L-1] (float32, CPU, 0
        off-mask; on every rank) from that update's own forward, before its optimiser step."""

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Current-policy log-probs [B, L-1] without gradient (the recomputed old log-probs)."""
        return sequence_logprobs(self.model, batch, self.cfg.temperature, self.cfg.micro_batch_size, self.shard,
                                 self.cfg.sequence_packing)

    def update(
        self,
        batch: TrainBatch,
        advantages: torch.Tensor,
        valid: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        *,
        ref_logprobs: torch.Tensor | None = None,
        tis_weights: torch.Tensor | None = None,
        on_micro_batch: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """Apply ``cfg.epochs`` optimiser steps on ``batch``; returns averaged metrics.

        ``advantages`` [B] and ``valid`` [B] come from the advantage estimator (invalid rows are
        masked out of the loss and its normaliser). ``old_logprobs``, ``ref_logprobs`` and
        ``tis_weights`` are [B, L-1].

        A pass whose gradient norm is not finite (a NaN or an overflow in the loss, a reward so large
        that its advantage overflows) makes no optimiser step: its gradients are dropped, the weights
        stay as they were, and ``nonfinite_skipped`` counts it (the trainer fails the job after
        ``trainer.maxNonFiniteSteps`` such steps in a row). Weights that are not finite after a step
        raise :class:`NonFiniteWeights`, before anything publishes or checkpoints them.

        ``old_logprobs`` None: the old policy is the one being updated, its log-probs taken (detached)
        from the update's own forward -- what a separate no-gradient pass before it would recompute, for
        one pass (``cfg.epochs`` 1: the parameters change only after the last micro-batch) and a forward
        with no dropout (:func:`forward_is_deterministic`). They are kept in :attr:`update_logprobs`.

        With a :attr:`shard` every rank gets the whole batch and trains on its rows: the normaliser
        is computed over the whole batch (so it is global across ranks), each rank's loss is
        multiplied by the world size to undo FSDP's mean over ranks (gradients are the sum over
        all rows, as on one process), and the metrics are summed over ranks. The result does not
        depend on the world size beyond float rounding.
        """
        cfg = self.cfg
        if cfg.kl_in_loss and ref_logprobs is None:
            raise ValueError("kl.coef > 0 with placement 'loss' needs reference log-probs")
        if old_logprobs is None and cfg.epochs != 1:
            raise ValueError(f"old log-probs from the update's own forward need one pass (epochsPerStep 1), "
                             f"not {cfg.epochs}: pass them recomputed")
        u = self._start_update(batch, advantages, valid, old_logprobs, ref_logprobs, tis_weights)
        params = self.trainable_parameters()
        stats = _Mean()
        grad_norms: list[float] = []
        losses: list[float] = []
        # Per micro-batch nothing is read back from the device (no host synchronisation): the token
        # count comes from the mask on the host, the loss and the metrics are summed on the device.
        self.model.train()
        skipped = 0
        for epoch in range(cfg.epochs):
            total = self._accumulate_gradients(u, epoch, stats, on_micro_batch)
            grad_norms.append(self._clip_gradients(params))
            losses.append(float(total))
            if math.isfinite(grad_norms[-1]):
                self.optimizer.step()
            else:  # the same decision on every rank: the norm is the global one
                skipped += 1
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.update_logprobs = None if u.own is None else whole_batch(u.own, batch.size, self.shard, u.dev)
        out = self._update_metrics(u, stats, losses, grad_norms)
        out["nonfinite_skipped"] = float(skipped)
        if not self.weights_finite():
            raise NonFiniteWeights("the policy's weights are not finite after the optimiser step: nothing of "
                                   "this step is published or checkpointed")
        return out

    def weights_finite(self) -> bool:
        """Whether every trainable parameter is finite (this rank's shards; with a :attr:`shard`, all
        ranks', every rank getting the same answer)."""
        flags = [torch.isfinite(_local(p)).all() for p in self.trainable_parameters()]
        ok = bool(torch.stack(flags).all())  # one read back from the device, not one per tensor
        if self.shard is not None and self.shard.world_size > 1:
            from .distributed import gather_objects

            ok = all(gather_objects(ok))
        return ok

    def _start_update(self, batch: TrainBatch, advantages: torch.Tensor, valid: torch.Tensor,
                      old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None,
                      tis_weights: torch.Tensor | None) -> _Update:
        """An :meth:`update`'s inputs as its micro-batches read them: the loss mask without the invalid
        rows and its global normaliser, this rank's rows, and where the update's own log-probs go."""
        mask = batch.loss_mask & valid.to(torch.bool).unsqueeze(-1)
        norm = compute_global_normaliser(self.cfg.loss_aggregation, mask)
        world = self.shard.world_size if self.shard is not None else 1
        if self.shard is None:
            rows, live = torch.arange(batch.size), torch.ones(batch.size, dtype=torch.bool)
        else:
            from .distributed import row_shard

            rows, live = row_shard(batch.size, self.shard.rank, world)
        dev = model_device(self.model)
        own = (torch.zeros((len(rows), batch.loss_mask.shape[1]), dtype=torch.float32, device=dev)
               if old_logprobs is None else None)
        return _Update(batch=batch, advantages=advantages, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
                       tis_weights=tis_weights, mask=mask, norm=norm, pl_cfg=self.cfg.policy_loss_config(),
                       world=world, rows=rows, live=live, dev=dev, own=own)

    def _accumulate_gradients(self, u: _Update, epoch: int, stats: _Mean,
                              on_micro_batch: Callable[[], None] | None) -> torch.Tensor:
        """One pass over this rank's rows: the gradients zeroed, then accumulated micro-batch by
        micro-batch. Returns the pass's loss (a tensor on the device)."""
        cfg = self.cfg
        # one optimiser step per pass over the whole batch: the micro-batch order changes nothing but
        # rounding, so every pass cuts them the cheapest way (by length, or a shared prompt together)
        share = shares(u.dev, self.model) and not cfg.sequence_packing
        order = order_rows(u.batch, u.rows, cfg.micro_batch_size, share, model_costs(self.model))
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float32, device=u.dev)
        parts = micro_batches(len(u.rows), cfg.micro_batch_size, order)
        mbs = [u.batch.select(u.rows[pos]) for pos in parts]
        # a pass's shared prompts in few forwards; each one's backward after its last micro-batch's
        prompts = step_prompts(self.model, u.batch, mbs, cfg.micro_batch_size, u.dev, u.world > 1) if share else None
        for k, (pos, mb) in enumerate(zip(parts, mbs)):
            total = total + self._micro_batch(u, epoch, pos, mb, (prompts, k) if prompts else None, stats)
            if prompts is not None:
                prompts.finished(k)
            if on_micro_batch is not None:
                on_micro_batch()
        return total

    def _micro_batch(self, u: _Update, epoch: int, pos: torch.Tensor, mb: TrainBatch,
                     step: tuple[StepPrompts, int] | None, stats: _Mean) -> torch.Tensor:
        """Forward, loss and backward of micro-batch ``mb`` (this rank's rows ``pos``); its metrics go
        into ``stats`` (the entropy in the first pass only). Returns its loss, detached, in float32."""
        cfg = self.cfg
        idx = u.rows[pos]
        w = mb.loss_mask.shape[1]
        m_host = u.mask[idx, :w] & u.live[pos].unsqueeze(-1)
        ntok = int(m_host.sum())
        m = m_host.to(u.dev)
        logits, start = forward_logits(self.model, mb, u.world > 1, step, cfg.sequence_packing)
        # [B, w], 0 left of the response window (those columns are off every row's mask)
        lp = torch.nn.functional.pad(logprobs_from_logits(logits, mb.targets[:, start:].to(u.dev),
                                                          cfg.temperature), (start, 0))
        old = self._old_logprobs(u, pos, idx, mb, lp)
        loss, pm = self._loss(u, idx, w, lp, old, m)
        (loss * u.world if u.world > 1 else loss).backward()
        if epoch == 0 and ntok > 0:
            with torch.no_grad():
                ent = entropy_from_logits(logits.detach(), cfg.temperature)
                pm = {**pm, "entropy": (ent * m[:, start:]).sum() / ntok}
        if ntok > 0:
            stats.add(pm, ntok)
        return loss.detach().float()

    @staticmethod
    def _old_logprobs(u: _Update, pos: torch.Tensor, idx: torch.Tensor, mb: TrainBatch,
                      lp: torch.Tensor) -> torch.Tensor:
        """The old policy's log-probs [b, w] of micro-batch ``mb`` (this rank's rows ``pos``, the batch's
        rows ``idx``): those given, else the policy's own ``lp`` detached, kept (0 off-mask) in ``u.own``."""
        w = mb.loss_mask.shape[1]
        if u.own is None:
            assert u.old_logprobs is not None
            return u.old_logprobs[idx, :w].to(u.dev, lp.dtype)
        old = lp.detach()
        keep = mb.loss_mask.to(u.dev) & u.live[pos].to(u.dev).unsqueeze(-1)
        u.own[pos.to(u.dev), :w] = torch.where(keep, old.float(), torch.zeros((), device=u.dev))
        return old

    def _loss(self, u: _Update, idx: torch.Tensor, w: int, lp: torch.Tensor, old: torch.Tensor,
              m: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A micro-batch's loss (batch rows ``idx``, log-probs ``lp`` [b, w], mask ``m``) and its metrics:
        the policy loss per token, × TIS weights, + KL to the reference, aggregated with the whole
        batch's normaliser."""
        cfg = self.cfg
        per_tok, pm = compute_policy_loss(cfg.policy_loss, lp, old, u.advantages[idx].to(u.dev, lp.dtype), m, u.pl_cfg)
        if u.tis_weights is not None:
            per_tok = per_tok * u.tis_weights[idx, :w].to(u.dev, per_tok.dtype)
        if cfg.kl_in_loss:
            assert u.ref_logprobs is not None
            per_tok, km = kl_in_loss(per_tok, lp, u.ref_logprobs[idx, :w].to(u.dev, lp.dtype), m,
                                     cfg.kl_estimator, cfg.kl_coef)
            pm = {**pm, "kl_ref": km["kl_mean"]}
        loss = aggregate_loss(cfg.loss_aggregation, per_tok, m, u.norm, cfg.max_response_tokens)
        return loss, pm

    def _clip_gradients(self, params: list[torch.nn.Parameter]) -> float:
        """Clip the accumulated gradients to ``cfg.grad_clip``; returns their norm before clipping (not
        finite: the gradients are not usable, :meth:`update` makes no step with them)."""
        gn = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        full = getattr(gn, "full_tensor", None)  # a DTensor under FSDP: the global norm
        return float(full() if full is not None else gn)

    def _update_metrics(self, u: _Update, stats: _Mean, losses: list[float],
                        grad_norms: list[float]) -> dict[str, float]:
        """An :meth:`update`'s metrics: the micro-batches' token-weighted means and the last pass's loss
        (summed over ranks), the gradient norms, the learning rate, the tokens trained on."""
        if self.shard is not None:
            from .distributed import gather_objects

            losses = [sum(x) for x in zip(*gather_objects(losses))]
            stats = _Mean.merge(gather_objects(stats.to_host()))
        out = stats.result()
        out["loss"] = losses[-1]
        out["grad_norm"] = grad_norms[-1]
        out["grad_norm_max"] = max(grad_norms)
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        out["loss_tokens"] = float(u.mask.sum())
        out["loss_normaliser"] = u.norm
        return out


FUSED_ADAMW_DEVICES = ("cpu", "cuda")
"""The trainer's devices with a fused AdamW kernel (torch checks only at the first step)."""


def build_optimizer(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, with torch's fused kernel when every parameter is a
    floating-point tensor on one of :data:`FUSED_ADAMW_DEVICES` (FSDP2's DTensors included):
    one pass over all parameters instead of a loop of element-wise operations per tensor. Transformers'
    Trainer (and so TRL) defaults to the same kernel. On this machine's CPU, for 3.9 M parameters in
    42 tensors: 3.2 ms a step against 14.7 ms (the default for-loop) and 10.1 ms (``foreach``)."""
    if not params:
        raise ValueError("no trainable parameters")
    fused = all(p.is_floating_point() and p.device.type in FUSED_ADAMW_DEVICES for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8,
                             fused=fused or None)


def lr_lambda(kind: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The multiplier of the base learning rate after ``s`` scheduler steps.

    Linear warmup over ``warmup_steps`` from 1/(warmup+1), then ``constant``, ``linear`` (to 0 at
    ``total_steps``) or ``cosine`` (to 0 at ``total_steps``).
    """
    import math

    if kind not in ("constant", "linear", "cosine"):
        raise ValueError(f"trainer.scheduler.kind must be constant, linear or cosine, got {kind!r}")

    def f(s: int) -> float:
        if warmup_steps and s < warmup_steps:
            return (s + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        span = max(total_steps - warmup_steps, 1)
        frac = min(max(s - warmup_steps, 0) / span, 1.0)
        return 1.0 - frac if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return f


def build_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping once per training step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(kind, warmup_steps, total_steps))


def learner_config(algorithm: Any, spec: Any) -> LearnerConfig:
    """A :class:`LearnerConfig` from a ``ResolvedAlgorithm`` and an ``RFTJobSpec``."""
    t = spec.trainer
    return LearnerConfig(
        policy_loss=algorithm.policy_loss, loss_aggregation=algorithm.loss_aggregation,
        clip_low=algorithm.clip_low, clip_high=algorithm.clip_high, dual_clip_c=algorithm.dual_clip_c,
        kl_coef=algorithm.kl_coef, kl_estimator=algorithm.kl_estimator, kl_placement=algorithm.kl_placement,
        epochs=t.epochs_per_step, micro_batch_size=t.micro_batch_size, temperature=spec.rollout.temperature,
        grad_clip=t.grad_clip, max_response_tokens=spec.rollout.max_tokens * spec.rollout.max_turns,
        gradient_checkpointing=bool(t.gradient_checkpointing), sequence_packing=bool(t.sequence_packing),
    )
