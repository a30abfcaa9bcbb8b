"""A left-padded, batched KV cache whose rows can join and leave between decode steps.

Rows are sequences; columns are cache positions. Padding is always on the left, so every row's next
token goes in the same (last) column. ``mask[b, t]`` is 1 where row ``b`` holds a real token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def _check_layers(cache: DynamicCache) -> list[DynamicLayer]:
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise TypeError(f"unsupported cache layer {type(layer).__name__}: only full attention is supported")
    return cache.layers


class PaddedKV:
    """A transformers ``DynamicCache`` plus its 2-D attention mask."""

    def __init__(self, cache: DynamicCache, mask: torch.Tensor):
        self.cache = cache
        self.mask = mask  # [B, T] long

    @property
    def rows(self) -> int:
        """Number of sequences."""
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        """Number of cache columns (real tokens plus left padding)."""
        return int(self.mask.shape[1])

    def select(self, index: torch.Tensor) -> None:
        """Keep (or repeat) the rows in ``index``, in that order; then drop all-padding columns."""
        index = index.to(self.mask.device)
        for layer in _check_layers(self.cache):
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.mask = self.mask.index_select(0, index)
        self.trim()

    def trim(self) -> None:
        """Drop leading columns that are padding in every row."""
        if self.rows == 0:
            return
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else self.length
        if first == 0:
            return
        for layer in _check_layers(self.cache):
            layer.keys = layer.keys[:, :, first:, :]
            layer.values = layer.values[:, :, first:, :]
        self.mask = self.mask[:, first:]

    def _left_pad(self, n: int) -> None:
        if n <= 0:
            return
        for layer in _check_layers(self.cache):
            layer.keys = F.pad(layer.keys, (0, 0, n, 0))
            layer.values = F.pad(layer.values, (0, 0, n, 0))
        self.mask = F.pad(self.mask, (n, 0))

    def extend(self, other: "PaddedKV") -> None:
        """Append ``other``'s rows below ours, left-padding the shorter of the two."""
        if len(self.cache.layers) != len(other.cache.layers):
            raise ValueError("caches from different models cannot be merged")
        length = max(self.length, other.length)
        self._left_pad(length - self.length)
        other._left_pad(length - other.length)
        for mine, theirs in zip(_check_layers(self.cache), _check_layers(other.cache)):
            mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
            mine.values = torch.cat([mine.values, theirs.values], dim=0)
        self.mask = torch.cat([self.mask, other.mask], dim=0)

    def append_column(self) -> torch.Tensor:
        """Extend the mask by one real column (for the token fed next) and return the new mask."""
        self.mask = F.pad(self.mask, (0, 1), value=1)
        return self.mask
