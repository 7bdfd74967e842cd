"""The KV pool of one attention-DP rank: paged blocks, plus a prefix cache kept as runs of whole blocks.

Used by the scheduler policies. vLLM's hash-block cache and SGLang's radix tree (page 1 token) are both
modelled as, per cache key, a run of leading blocks [0, extent): a request hits the blocks its key
already holds. Freed blocks stay cached and are evicted oldest-freed first, a request's tail first
(vLLM frees blocks in reverse so prefixes survive), so every key's content stays a prefix run.
Pure bookkeeping with integer counts; no per-token work.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["KvPool"]


class KvPool:
    """Block counts of one pool: allocated to sequences, pinned (cached and referenced), cached-free, empty.

    Invariant: allocated + pinned + cached + empty == total. "In use" is allocated + pinned; the
    allocatable room is empty + cached (cached blocks are evicted on demand).
    """

    __slots__ = ("_cached", "_cached_total", "_pinned", "_pinned_total", "allocated", "caching", "empty", "page_tokens", "total")

    def __init__(self, total_blocks: int, *, page_tokens: int, caching: bool) -> None:
        self.total = int(total_blocks)
        self.page_tokens = int(page_tokens)
        self.caching = caching
        self.allocated = 0
        self.empty = self.total
        self._pinned: dict[int, list[int]] = {}  # key -> [holders, extent]
        self._pinned_total = 0
        self._cached: OrderedDict[int, int] = OrderedDict()  # key -> extent, oldest freed first
        self._cached_total = 0

    @property
    def in_use(self) -> int:
        """Blocks referenced by running or transferring sequences."""
        return self.allocated + self._pinned_total

    @property
    def free(self) -> int:
        """Blocks an allocation may take now (empty, then evicted cache)."""
        return self.empty + self._cached_total

    @property
    def cached(self) -> int:
        return self._cached_total

    def check(self) -> None:
        """Raise if the block counts do not add up (used by tests)."""
        assert self.allocated >= 0 and self.empty >= 0 and self._pinned_total >= 0 and self._cached_total >= 0
        assert self.allocated + self._pinned_total + self._cached_total + self.empty == self.total
        assert self._cached_total == sum(self._cached.values())
        assert self._pinned_total == sum(e for _, e in self._pinned.values())

    def extent(self, key: int) -> int:
        """Leading blocks of `key` present in the pool (pinned or cached)."""
        if not self.caching:
            return 0
        held = self._pinned.get(key)
        if held is not None:
            return held[1]
        return self._cached.get(key, 0)

    def evictable_extent(self, key: int) -> int:
        """Blocks of `key` that are cached but unreferenced (they stop counting as free once acquired)."""
        return self._cached.get(key, 0)

    def acquire(self, key: int) -> None:
        """Reference `key`'s cached blocks from a sequence: they can no longer be evicted."""
        held = self._pinned.get(key)
        if held is not None:
            held[0] += 1
            return
        ext = self._cached.pop(key, 0)
        self._cached_total -= ext
        self._pinned[key] = [1, ext]
        self._pinned_total += ext

    def release(self, key: int) -> None:
        """Drop one reference to `key`; with the last one its blocks become cached (evictable)."""
        held = self._pinned.get(key)
        if held is None:
            return
        held[0] -= 1
        if held[0] > 0:
            return
        del self._pinned[key]
        self._pinned_total -= held[1]
        if held[1] > 0:
            self._cached[key] = held[1]
            self._cached_total += held[1]

    def allocate(self, blocks: int) -> bool:
        """Take `blocks` for a sequence, evicting cached blocks oldest-first; False (and no change) if short."""
        if blocks <= 0:
            return True
        if blocks > self.empty + self._cached_total:
            return False
        take = min(blocks, self.empty)
        self.empty -= take
        rest = blocks - take
        while rest > 0:
            key, ext = next(iter(self._cached.items()))
            cut = min(ext, rest)
            rest -= cut
            self._cached_total -= cut
            if cut == ext:
                del self._cached[key]
            else:
                self._cached[key] = ext - cut
        self.allocated += blocks
        return True

    def free_allocated(self, blocks: int) -> None:
        """Return blocks a sequence allocated and whose content is not worth caching."""
        self.allocated -= blocks
        self.empty += blocks

    def donate(self, key: int, *, upto_blocks: int, from_allocated: int) -> int:
        """Hand a sequence's computed leading blocks of `key` (up to `upto_blocks`) to the cache.

        Only blocks beyond the key's current extent are new content; they move out of the allocation
        (at most `from_allocated`). Returns how many moved; the caller frees the rest of its blocks.
        """
        if not self.caching or key is None:
            return 0
        held = self._pinned.get(key)
        current = held[1] if held is not None else self._cached.get(key, 0)
        grow = min(max(0, upto_blocks - current), from_allocated)
        if grow <= 0:
            return 0
        self.allocated -= grow
        if held is not None:
            held[1] += grow
            self._pinned_total += grow
        else:
            self._cached[key] = current + grow
            self._cached.move_to_end(key)
            self._cached_total += grow
        return grow
