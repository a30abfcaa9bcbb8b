"""Shared-prompt forward passes: a prompt that several rows of a micro-batch share is run once.

A GRPO group is ``n`` samples of one prompt, so a micro-batch cut from one group holds ``n`` copies of
the same prompt tokens. Here the micro-batch's distinct prompts go through the model once (right-padded,
keeping their key/value cache with its autograd graph), the cache is repeated for the rows that share
each prompt, and only the rows' continuations (responses, and the tool tokens of later turns) go
through the model a second time, attending to their prompt's cache. The backward pass sums each
prompt's gradients over its rows, so the loss and the gradients are those of running every row
whole, up to float rounding (``tests/trainer/test_prefix.py``).

:func:`order_rows` cuts micro-batches so that rows of one prompt sit together when that costs less than
cutting by length, and :func:`prompt_owners` runs a micro-batch shared only when that costs less than
running its rows whole. Both ask a :class:`CostModel`: tokens run, attention's query-key pairs, the
cache rows copied and a fixed cost per forward pass, per decoder layer, with the model's sizes. The
fixed cost is why counting tokens is not enough: a forward of a small model on the CPU is about as dear
as hundreds of its tokens, so a short prompt is not worth a second forward. The continuations of a
micro-batch run in one or more forwards, rows of similar lengths together, so that each is padded
little (the benchmark's micro-batch of 8 rows of 64-128-token responses: two). The prompts of
consecutive micro-batches run in one forward (:class:`StepPrompts`), whose backward follows their last
micro-batch's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

SHARE_PROMPTS = True
"""Run a micro-batch's shared prompts once (False: every row whole; for benchmarks and tests)."""

SHARE_ON = frozenset({"cpu"})
"""The device types on which prompts are shared. On one H200 (365 M parameters, bf16, micro-batches of
16 rows holding one or two prompts of 256 tokens) the two forward passes made the step slower, 0.98-1.32 s
against 0.59-0.62 s for whole rows, although they ran fewer tokens (``bench/trainer_vs_trl.py``,
``ours`` against ``ours_whole_rows``): there the step is bound by launching kernels, and a second
forward per micro-batch costs more launches than the tokens it saves. On the CPU the step is bound by
the tokens it runs, and sharing saves them."""


def shares(device: torch.device, model: torch.nn.Module | None = None) -> bool:
    """Whether micro-batches of ``model`` on ``device`` run their shared prompts once: not where the model
    checkpoints its layers' activations (a checkpointed layer's training forward keeps no cache,
    :mod:`.checkpointing`)."""
    if model is not None:
        from .checkpointing import checkpointed

        if checkpointed(model):
            return False
    return SHARE_PROMPTS and device.type in SHARE_ON


def _prompt_keys(batch: Any, rows: torch.Tensor | None = None) -> list[int]:
    """For each row (of ``rows``, or of the batch), the index of its prompt among the distinct prompts,
    numbered in order of first appearance."""
    ids = batch.input_ids if rows is None else batch.input_ids[rows]
    plen = batch.prompt_lengths if rows is None else batch.prompt_lengths[rows]
    index: dict[tuple[int, ...], int] = {}
    return [index.setdefault(tuple(ids[i, :p].tolist()), len(index)) for i, p in enumerate(plen.tolist())]


class SharePlan(NamedTuple):
    """How :func:`shared_logits` runs a micro-batch: ``leaders`` the first row of each distinct prompt,
    ``owner`` for every row the index of its prompt in ``leaders``, ``chunks`` the rows' continuation
    forwards (row indices; rows of similar continuation lengths together, so that each forward pads
    little)."""

    leaders: list[int]
    owner: list[int]
    chunks: list[list[int]]


@dataclass(frozen=True)
class CostModel:
    """Seconds per decoder layer of a micro-batch's forward and backward on the CPU, for choosing how
    to run it. Fitted (relative error about 5 %) to 240 measured micro-batches of two models on the
    2-core development VM: 8-400-token prompts, 4-256-token continuations, 4-16 rows of one or two
    prompts (``bench/prefix_costs.py``). A faster machine scales every term alike, and choices
    depend only on the ratios."""

    token: float
    """One token through the layer's matrix products and element-wise work."""
    pair: float
    """One query-key pair of attention."""
    cached: float
    """One prompt position of the key/value cache repeated for one row (and summed back in the
    backward)."""
    forward: float
    """One forward pass and its backward, whatever its size (the fixed cost of its operations)."""

    @classmethod
    def of(cls, config: Any) -> "CostModel":
        """The costs of a decoder layer of a Hugging Face ``config`` (Llama-style: attention with
        grouped key/value heads and a gated MLP)."""
        hidden = int(getattr(config, "hidden_size", 64))
        inter = int(getattr(config, "intermediate_size", 4 * hidden))
        heads = int(getattr(config, "num_attention_heads", 1))
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        macs = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter
        return cls(token=1.16e-11 * macs + 1.5e-8 * (hidden + inter), pair=6e-11 * 2 * heads * head_dim,
                   cached=6.3e-9 * 2 * kv_heads * head_dim, forward=2e-3)

    def whole(self, rows: int, width: int) -> float:
        """One forward of ``rows`` rows of ``width`` tokens (causal attention)."""
        return self.forward + rows * width * (self.token + self.pair * (width + 1) / 2)

    def continuation(self, rows: int, prompt: int, width: int) -> float:
        """One forward of ``rows`` continuations of ``width`` tokens against a cache of ``prompt``
        positions (masked attention over all of it)."""
        return (self.forward + rows * width * (self.token + self.pair * (prompt + width))
                + rows * prompt * self.cached)


COSTS: CostModel | None = None
"""The costs every choice uses (None: each model's own, :meth:`CostModel.of` its config; tests set
token counts here to make the shared path run on a tiny model)."""


def model_costs(model: torch.nn.Module) -> CostModel:
    """The :class:`CostModel` of ``model``'s layers (a generic small model's without a config)."""
    return COSTS or CostModel.of(getattr(model, "config", None))


def _chunks(rest: list[int], prompt: int, costs: CostModel) -> tuple[float, list[list[int]]]:
    """The cheapest split of rows (continuation lengths ``rest``, ascending) into contiguous
    continuation forwards against a cache of ``prompt`` positions: ``(cost, chunks)``. A chunk whose
    rows have at most one continuation token needs no forward (its only prediction is the prompt's)."""
    n = len(rest)
    # boundaries: every row for up to 32 rows, else 32 evenly spaced ones (the search is quadratic)
    bounds = sorted({n * k // min(n, 32) for k in range(min(n, 32) + 1)})
    best = {0: 0.0}
    cut = {0: 0}
    for j in bounds[1:]:
        width = rest[j - 1]
        best[j] = float("inf")
        for i in bounds[: bounds.index(j)]:
            c = best[i] + (0.0 if width <= 1 else costs.continuation(j - i, prompt, width))
            if c < best[j]:
                best[j], cut[j] = c, i
    chunks, j = [], n
    while j:
        chunks.append(list(range(cut[j], j)))
        j = cut[j]
    return best[n], chunks[::-1]


def _plan(keys: list[int], prompts: list[int], lengths: list[int], costs: CostModel,
          collective: bool) -> tuple[float, SharePlan | None]:
    """The cost of a micro-batch (its rows' prompt ``keys``, prompt lengths and lengths) and its
    :class:`SharePlan`, or None where running every row whole costs less."""
    whole = costs.whole(len(lengths), max(lengths))
    leaders = [keys.index(u) for u in range(max(keys) + 1)]
    if not collective and len(leaders) == len(keys):
        return whole, None
    width = max(prompts)
    rest = [n - p for n, p in zip(lengths, prompts)]
    if collective:  # one continuation forward on every rank, whatever the lengths (collectives must match)
        cost = costs.whole(len(leaders), width) + costs.continuation(len(rest), width, max(max(rest), 2))
        return cost, SharePlan(leaders, keys, [list(range(len(rest)))])
    order = sorted(range(len(rest)), key=rest.__getitem__)
    cost, chunks = _chunks([rest[i] for i in order], width, costs)
    cost += costs.whole(len(leaders), width)
    if cost >= whole:
        return whole, None
    return cost, SharePlan(leaders, keys, [[order[i] for i in c] for c in chunks])


def prompt_owners(batch: Any, collective: bool = False, costs: CostModel | None = None) -> SharePlan | None:
    """How to run a micro-batch whose rows share prompts (:class:`SharePlan`), or None where running
    every row whole costs less under ``costs`` (or no two rows share a prompt, or prompt lengths
    are unknown).

    ``collective``: the model is sharded over several ranks, whose forward passes are collectives and
    must match in number; then every micro-batch takes the shared path (two forwards) whether or not
    its rows share a prompt."""
    if batch.prompt_lengths is None:
        return None
    return _plan(_prompt_keys(batch), batch.prompt_lengths.tolist(), batch.lengths.tolist(),
                 costs or COSTS or CostModel.of(None), collective)[1]


def _micro_batch_cost(keys: list[int], prompts: list[int], lengths: list[int], rows: list[int],
                      costs: CostModel) -> float:
    sub = [keys[i] for i in rows]
    renumber: dict[int, int] = {}
    return _plan([renumber.setdefault(k, len(renumber)) for k in sub], [prompts[i] for i in rows],
                 [lengths[i] for i in rows], costs, False)[0]


def order_rows(batch: Any, rows: torch.Tensor, size: int, share: bool = True,
               costs: CostModel | None = None) -> torch.Tensor:
    """Positions into ``rows`` in the order micro-batches of ``size`` are cut: by length (so each
    micro-batch is trimmed to little padding), or, when cheaper under ``costs``, rows of one prompt
    together (ordered by prompt length, then by prompt), so each micro-batch runs few prompts
    (``share``: prompts are shared, see :func:`shares`). Within a micro-batch of shared prompts the
    rows are ordered by length, so that :func:`shared_logits`' continuation forwards take
    neighbouring rows."""
    lengths = batch.lengths[rows]
    # by length (stable): micro-batches of similar lengths, each trimmed to its own longest row by
    # TrainBatch.select; gradients are accumulated over the whole batch, so the order changes nothing
    # but float rounding
    by_len = torch.argsort(lengths, stable=True)
    if batch.prompt_lengths is None or not share:
        return by_len
    prompts = batch.prompt_lengths[rows].tolist()
    keys = _prompt_keys(batch, rows)
    if len(set(keys)) == len(keys):
        return by_len
    costs = costs or COSTS or CostModel.of(None)
    lens = lengths.tolist()
    rest = [n - p for n, p in zip(lens, prompts)]
    grouped = sorted(range(len(keys)), key=lambda i: (prompts[i], keys[i]))
    grouped = [i for c in range(0, len(grouped), size) for i in sorted(grouped[c : c + size], key=rest.__getitem__)]
    by_len_l = by_len.tolist()
    cost = {}
    for name, order in (("whole", by_len_l), ("grouped", grouped)):
        cost[name] = sum(_micro_batch_cost(keys, prompts, lens, order[c : c + size], costs)
                         for c in range(0, len(order), size))
    return torch.tensor(grouped, dtype=torch.long) if cost["grouped"] < cost["whole"] else by_len


class _PromptCache:
    """Prompts' key/value cache (``base``: each layer's keys and values, with their autograd graph or as
    leaves), repeated for the rows of each continuation forward.

    Rows are repeated with ``index_select`` rather than the cache's own ``batch_select_indices``
    (advanced indexing): the rows are the same, but the backward of advanced indexing is an
    accumulating ``index_put`` that the CPU runs row by row for repeated indices, and
    ``index_select``'s is an ``index_add`` (the benchmark's batch, 8 micro-batches of 8 rows of one
    64-token prompt: forward and backward 11 % faster). A layer type with more state than keys and values (a sliding
    window's) is selected by its own method, once: then the micro-batch's continuations run as one
    forward."""

    def __init__(self, cache: Any) -> None:
        from transformers.cache_utils import DynamicLayer

        layers: Any = getattr(cache, "layers", None)
        self.cache = cache
        self.reusable = layers is not None and all(type(layer) is DynamicLayer and layer.is_initialized
                                                   for layer in layers)
        self.base = [(layer.keys, layer.values) for layer in layers] if self.reusable else []

    def rows(self, owner: torch.Tensor) -> Any:
        """The cache with row ``b`` holding prompt ``owner[b]``'s keys and values (replacing what an
        earlier continuation forward appended)."""
        if not self.reusable:
            self.cache.batch_select_indices(owner)
            return self.cache
        for layer, (keys, values) in zip(self.cache.layers, self.base):
            layer.keys, layer.values = keys.index_select(0, owner), values.index_select(0, owner)
        return self.cache


class PromptRun:
    """Distinct prompts run through the model once, right-padded (a padding position attends to real
    tokens, never to none): their key/value cache (:class:`_PromptCache`), the logits at each prompt's
    last position (the prediction of its first continuation token), and the padding mask.

    ``leaves``: the cache and the logits are kept as leaf tensors, so that several micro-batches' continuation
    forwards and backward passes can use them one after another (gradients accumulate on the leaves);
    :meth:`backward` then runs the prompts' own backward once, with those gradients. Otherwise (one
    micro-batch) the gradients flow through the prompts' graph in that micro-batch's backward."""

    def __init__(self, model: torch.nn.Module, prompts: list[tuple[int, ...]], device: torch.device,
                 leaves: bool = False) -> None:
        self.index = {p: u for u, p in enumerate(prompts)}
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        self.mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for u, p in enumerate(prompts):
            ids[u, : len(p)] = torch.tensor(p, dtype=torch.long)
            self.mask[u, : len(p)] = 1
        # the output layer only at each prompt's last position
        lasts = sorted(set(n - 1 for n in lengths))
        out = model(input_ids=ids.to(device), attention_mask=self.mask.to(device), use_cache=True,
                    logits_to_keep=torch.tensor(lasts, dtype=torch.long, device=device))
        col = torch.tensor([lasts.index(n - 1) for n in lengths], dtype=torch.long, device=device)
        first = out.logits[torch.arange(len(prompts), device=device), col]  # [U, V]
        if out.past_key_values is None:  # a model that drops its cache while training (gradient checkpointing)
            raise RuntimeError(f"{type(model).__name__} returned no key/value cache; set "  # cannot share
                               "rft_runtime.trainer.prefix.SHARE_PROMPTS = False to run every row whole")
        self.cache = _PromptCache(out.past_key_values)
        self.reusable = self.cache.reusable
        self._outputs: list[torch.Tensor] = []
        self._leaves: list[torch.Tensor] = []
        outputs = [first, *(t for kv in self.cache.base for t in kv)]
        if leaves and self.reusable and any(t.requires_grad for t in outputs):
            # (a frozen first layer's keys, under LoRA say, need no gradient and get none)
            self._outputs = outputs
            self._leaves = [t.detach().requires_grad_(t.requires_grad) for t in outputs]
            first = self._leaves[0]
            self.cache.base = list(zip(self._leaves[1::2], self._leaves[2::2]))
        self.first = first

    def backward(self) -> None:
        """The prompts' backward with the gradients their leaves gathered (none: nothing to run); the
        graph is freed either way."""
        pairs = [(o, leaf.grad) for o, leaf in zip(self._outputs, self._leaves) if leaf.grad is not None]
        self._outputs, self._leaves = [], []
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def _row_prompts(batch: Any, rows: list[int]) -> list[tuple[int, ...]]:
    plen = batch.prompt_lengths
    return [tuple(batch.input_ids[r, : int(plen[r])].tolist()) for r in rows]


class StepPrompts:
    """The prompts of a pass's shared micro-batches (:func:`prompt_owners`), run in as few forwards as
    the micro-batch size allows instead of one per micro-batch: a :class:`PromptRun` holds the distinct
    prompts of consecutive micro-batches, at most ``size`` of them (its activations are no more than a
    micro-batch of ``size`` rows holds), and is run when its first micro-batch needs it; with gradients, its
    backward runs after its last micro-batch's (:meth:`finished`), before the optimiser step. A batch of
    8 micro-batches of 8 rows, each of one prompt: one prompt forward a pass instead of eight; on the
    2-core development VM the step 16 % shorter with 256-token prompts and 16-token responses, 2 % with
    ``bench/trainer_vs_trl.py``'s 64-token prompts and 64-128-token responses (docs/trainer.md).

    Only where one process runs a plain module: FSDP's forward and backward hooks expect a module's
    backward to follow its own forward, and ranks sharding a model run matching collectives."""

    def __init__(self, batch: Any, parts: list[Any], size: int, costs: CostModel) -> None:
        self.plans: list[SharePlan | None] = []
        self.group_of: list[int | None] = []
        self.groups: list[list[tuple[int, ...]]] = []
        self.last_use: list[int] = []
        self.runs: dict[int, PromptRun] = {}
        self.off = False
        for k, mb in enumerate(parts):
            plan = prompt_owners(mb, False, costs)
            self.plans.append(plan)
            if plan is None:
                self.group_of.append(None)
                continue
            keys = _row_prompts(mb, plan.leaders)
            if not self.groups or len(set(self.groups[-1]) | set(keys)) > max(size, len(keys)):
                self.groups.append([])
                self.last_use.append(k)
            self.groups[-1].extend([p for p in dict.fromkeys(keys) if p not in self.groups[-1]])
            self.group_of.append(len(self.groups) - 1)
            self.last_use[-1] = k

    def run(self, k: int, model: torch.nn.Module, device: torch.device) -> PromptRun | None:
        """Micro-batch ``k``'s prompt run (None: it runs its own; after a model whose cache cannot be
        reused, every micro-batch does)."""
        g = self.group_of[k]
        if g is None or self.off:
            return None
        if g not in self.runs:
            run = PromptRun(model, self.groups[g], device, leaves=True)
            if not run.reusable:
                self.off = True
                return None
            self.runs[g] = run
        return self.runs[g]

    def finished(self, k: int) -> None:
        """After micro-batch ``k``'s backward (or its no-gradient forward): the backward of a prompt run
        it was the last to use, and the run freed."""
        g = self.group_of[k]
        if g is not None and self.last_use[g] == k and g in self.runs:
            self.runs.pop(g).backward()


def step_prompts(model: torch.nn.Module, batch: Any, parts: list[Any], size: int, device: torch.device,
                 collective: bool) -> StepPrompts | None:
    """The :class:`StepPrompts` of a pass over micro-batches ``parts`` (``TrainBatch`` each), or None where
    prompts are run per micro-batch: not shared on ``device``, a sharded model (``collective``, or FSDP
    over one process), or no micro-batch shares a prompt."""
    if collective or not shares(device, model) or batch.prompt_lengths is None:
        return None
    from torch.distributed.fsdp import FSDPModule

    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return None
    sp = StepPrompts(batch, parts, size, model_costs(model))
    return sp if sp.groups else None


def shared_logits(model: torch.nn.Module, batch: Any, start: int, plan: SharePlan,
                  device: torch.device, collective: bool = False, run: PromptRun | None = None) -> torch.Tensor:
    """The logits ``[B, W - start, V]`` (float32) predicting ``batch.targets[:, start:]``, as a whole
    forward of every row gives them, computed with each distinct prompt run once and the rows'
    continuations in ``plan.chunks`` (see the module). ``run``: the rows' prompts already run (by
    :class:`StepPrompts`; else they are run here)."""
    leaders, owner_l, chunks = plan
    plen = batch.prompt_lengths
    width = int(batch.input_ids.shape[1])
    prompts = _row_prompts(batch, leaders)
    if run is None:
        run = PromptRun(model, prompts, device)
    owner = torch.tensor([run.index[prompts[u]] for u in owner_l], dtype=torch.long)
    first = run.first[owner.to(device)]  # [B, V]: predicts token p of each row
    cache = run.cache
    if not cache.reusable:
        chunks = [[r for c in chunks for r in c]]

    rest = (batch.lengths - plen).tolist()
    # column j of a row's output predicts target index start + j: index j + start - (p - 1) of its `seq`
    align = torch.arange(start, width - 1).unsqueeze(0) - (plen - 1).unsqueeze(1)
    parts = []
    for rows in chunks:
        idx = torch.tensor(rows, dtype=torch.long)
        c_real = max(rest[r] for r in rows)
        head = first[idx.to(device)].unsqueeze(1)
        if c_real <= 1 and not collective:  # no continuation token predicts another: the prompts' last
            seq = head.float()  # logits are all there is
        else:
            c_max = max(c_real, 2)  # (collective: the second forward runs on every rank, here on padding)
            cont_ids = torch.zeros((len(rows), c_max), dtype=torch.long)
            cont_mask = torch.zeros((len(rows), c_max), dtype=torch.long)
            for b, r in enumerate(rows):
                p, n = int(plen[r]), rest[r]
                cont_ids[b, :n] = batch.input_ids[r, p : p + n]
                cont_mask[b, :n] = 1
            mask = torch.cat([run.mask[owner[idx]], cont_mask], dim=1)
            positions = plen[idx].unsqueeze(1) + torch.arange(c_max).unsqueeze(0)
            out2 = model(input_ids=cont_ids.to(device), attention_mask=mask.to(device),
                         position_ids=positions.to(device), past_key_values=cache.rows(owner[idx].to(device)),
                         use_cache=True, logits_to_keep=torch.arange(c_max - 1, device=device))
            # column k of `seq` predicts target index p - 1 + k of its row
            seq = torch.cat([head, out2.logits[:, : max(c_real - 1, 0)]], dim=1).float()
        # off a row's span: some real logits, masked by the loss
        a = align[idx].clamp(0, seq.shape[1] - 1).to(device)
        parts.append(seq.gather(1, a.unsqueeze(-1).expand(-1, -1, seq.shape[-1])))
    logits = parts[0] if len(parts) == 1 else torch.cat(parts)
    done = [r for c in chunks for r in c]
    if done != list(range(len(done))):  # back to the micro-batch's row order
        logits = logits.index_select(0, torch.argsort(torch.tensor(done)).to(device))
    return logits
