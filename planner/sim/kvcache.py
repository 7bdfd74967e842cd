"""The KV pool of one attention-DP rank: paged blocks, plus a prefix cache kept as runs of whole blocks.

Used by the scheduler policies. vLLM's hash-block cache and SGLang's radix tree (page 1 token) are both
modelled as, per cache key, a run of leading blocks [0, extent): a request hits the blocks its key
already holds. Freed blocks stay cached and are evicted oldest-freed first, a request's tail first
(vLLM frees blocks in reverse so prefixes survive), so every key's content stays a prefix run. A key's
run is pinned only as deep as its deepest holder references; the rest of it stays evictable.
Pure bookkeeping with integer counts; no per-token work.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["KvPool"]


class KvPool:
    """Block counts of one pool: allocated to sequences, pinned (cached and referenced), cached-free, empty.

    Invariant: allocated + pinned + cached + empty == total. "In use" is allocated + pinned; the
    allocatable room is empty + cached (cached blocks are evicted on demand). A key's run [0, extent) is
    pinned up to the deepest block a holder references (holders may reference different depths: a request
    sharing fewer leading tokens hits fewer blocks); the rest of the run is cached and evictable, tail first,
    as vLLM's free queue holds the blocks no running request references (vllm/v1/core/block_pool.py).
    """

    __slots__ = ("_cached", "_cached_total", "_holders", "_pinned", "_pinned_total", "allocated", "caching", "empty",
                 "page_tokens", "total")

    def __init__(self, total_blocks: int, *, page_tokens: int, caching: bool) -> None:
        self.total = int(total_blocks)
        self.page_tokens = int(page_tokens)
        self.caching = caching
        self.allocated = 0
        self.empty = self.total
        self._holders: dict[int, list[int]] = {}  # key -> the depth (blocks) each holder references
        self._pinned: dict[int, int] = {}  # key -> pinned leading blocks (the deepest holder's depth)
        self._pinned_total = 0
        self._cached: OrderedDict[int, int] = OrderedDict()  # key -> evictable blocks past its pinned run, oldest freed first
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
        assert self._pinned_total == sum(self._pinned.values())
        assert all(self._pinned.get(k, 0) == max(d) for k, d in self._holders.items())
        assert set(self._pinned) <= set(self._holders)

    def extent(self, key: int) -> int:
        """Leading blocks of `key` present in the pool (pinned or cached)."""
        if not self.caching:
            return 0
        return self._pinned.get(key, 0) + self._cached.get(key, 0)

    def evictable_extent(self, key: int, depth: int | None = None) -> int:
        """Blocks among `key`'s first `depth` (all by default) that are cached but unreferenced (they stop
        counting as free once acquired)."""
        cached = self._cached.get(key, 0)
        if depth is None:
            return cached
        return max(0, min(depth - self._pinned.get(key, 0), cached))

    def _pin_to(self, key: int, depth: int) -> None:
        """Pin `key`'s leading `depth` blocks (taking them from its cached tail), or unpin down to it."""
        old = self._pinned.get(key, 0)
        if depth > old:
            take = depth - old
            ext = self._cached.get(key, 0)
            assert take <= ext, "acquiring blocks the key does not hold"
            self._cached_total -= take
            if take == ext:
                del self._cached[key]
            else:
                self._cached[key] = ext - take
        elif depth < old:
            back = old - depth
            self._cached[key] = self._cached.get(key, 0) + back
            self._cached.move_to_end(key)
            self._cached_total += back
        self._pinned_total += depth - old
        if depth > 0:
            self._pinned[key] = depth
        else:
            self._pinned.pop(key, None)

    def acquire(self, key: int, depth: int | None = None) -> int:
        """Reference `key`'s leading `depth` blocks (its whole run by default) from a sequence: they can no
        longer be evicted. Returns the depth referenced (pass it to `release`)."""
        d = self.extent(key) if depth is None else int(depth)
        held = self._holders.setdefault(key, [])
        held.append(d)
        if d > self._pinned.get(key, 0):
            self._pin_to(key, d)
        return d

    def release(self, key: int, depth: int) -> None:
        """Drop a reference of `depth` blocks to `key`; blocks no holder references any more become cached."""
        held = self._holders.get(key)
        if held is None or depth not in held:
            return
        held.remove(depth)
        deepest = max(held) if held else 0
        if not held:
            del self._holders[key]
        if deepest < self._pinned.get(key, 0):
            self._pin_to(key, deepest)

    def allocate(self, blocks: int) -> bool:
        """Take `blocks` for a sequence, evicting cached blocks oldest-first; False (and no change) if short."""
        if blocks <= 0:
            return True
        empty = self.empty
        if blocks <= empty:  # no eviction
            self.empty = empty - blocks
            self.allocated += blocks
            return True
        if blocks > empty + self._cached_total:
            return False
        self.empty = 0
        rest = blocks - empty
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
        (at most `from_allocated`) into the key's cached tail (the caller pins what it keeps referencing).
        Returns how many moved; the caller frees the rest of its blocks.
        """
        if not self.caching or key is None:
            return 0
        current = self.extent(key)
        grow = min(max(0, upto_blocks - current), from_allocated)
        if grow <= 0:
            return 0
        self.allocated -= grow
        self._cached[key] = self._cached.get(key, 0) + grow
        self._cached.move_to_end(key)
        self._cached_total += grow
        return grow
