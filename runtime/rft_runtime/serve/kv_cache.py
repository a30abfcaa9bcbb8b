"""A preallocated per-slot KV cache: one row (slot) per running sequence, written in place.

``keys[layer]`` and ``values[layer]`` are ``[slots, kv_heads, capacity, head_dim]``. A sequence holds
one slot from admission to retirement; its token at position ``p`` lives in column ``p`` of its slot.
Nothing moves when sequences join or leave (slots are handed out lowest-first, so the running slots
stay dense and decode attention reads ``keys[:S]`` as a view). The column capacity starts small and
doubles, up to the model's context length, when a sequence outgrows it: a copy every doubling, never
per step. One row beyond the slots, :attr:`SlotKVCache.spare`, is held by no sequence: a fixed-shape
decode iteration (:mod:`.graphs`) writes its padding rows' keys and values there.
"""

from __future__ import annotations

import heapq

import torch


class SlotKVCache:
    """KV tensors for ``slots`` sequences of up to ``max_len`` tokens each."""

    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, slots: int, max_len: int,
                 dtype: torch.dtype, device: torch.device, initial_len: int = 256):
        if slots < 1 or max_len < 1:
            raise ValueError("a KV cache needs at least one slot and one column")
        self.slots, self.max_len = slots, max_len
        self.spare = slots  # the row no sequence holds
        self.shape = (kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.capacity = min(max_len, max(16, initial_len))
        self.keys = [self._empty(self.capacity) for _ in range(layers)]
        self.values = [self._empty(self.capacity) for _ in range(layers)]
        self._free = list(range(slots))  # a heap: the lowest free slot first

    def _empty(self, columns: int) -> torch.Tensor:
        return torch.zeros((self.slots + 1, self.shape[0], columns, self.shape[1]), dtype=self.dtype, device=self.device)

    @property
    def free_slots(self) -> int:
        """Slots not held by a sequence."""
        return len(self._free)

    def alloc(self) -> int:
        """Take the lowest free slot."""
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        return heapq.heappop(self._free)

    def release(self, slot: int) -> None:
        """Give ``slot`` back (its contents are overwritten by the next holder)."""
        heapq.heappush(self._free, slot)

    def reset(self) -> None:
        """Free every slot."""
        self._free = list(range(self.slots))

    def ensure(self, length: int) -> None:
        """Make room for ``length`` columns (doubling the capacity, at most up to ``max_len``)."""
        if length <= self.capacity:
            return
        if length > self.max_len:
            raise ValueError(f"a sequence of {length} tokens exceeds the cache's {self.max_len} columns")
        cap = min(self.max_len, max(length, 2 * self.capacity))
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = self._empty(cap)
                new[:, :, : self.capacity].copy_(old)
                store[i] = new
        self.capacity = cap

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` columns of slot ``src`` to slot ``dst`` (a shared prompt)."""
        for store in (self.keys, self.values):
            for t in store:
                t[dst, :, :length].copy_(t[src, :, :length])
