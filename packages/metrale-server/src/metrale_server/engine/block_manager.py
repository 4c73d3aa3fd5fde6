"""``BlockManager``: which KV blocks each sequence holds, and the prefix cache over them."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Final

import attrs

from metrale_server.engine.block_hash import BlockHash
from metrale_server.engine.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """The pool cannot give the blocks asked for now; the manager was left unchanged."""


@attrs.frozen(kw_only=True)
class PrefixCacheStats:
    """Counters since the manager was built, over every ``allocate`` (re-admissions included).

    ``num_queried_tokens`` is the tokens looked up, ``num_hit_tokens`` those found in
    registered blocks, ``num_evicted_blocks`` the registered blocks reused for other tokens.
    All stay 0 without prefix caching; ``reset_prefix_cache`` does not reset them.
    """

    num_queried_tokens: int = 0
    num_hit_tokens: int = 0
    num_evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class BlockManager:
    """Owns the block ids ``0..num_blocks-1`` of one KV pool and the prefix cache over them.

    Token ``i`` of a sequence lives in slot ``i % block_size`` of ``block_table[i //
    block_size]``. Every block is in exactly one state: referenced (by one or more
    (sequence, position) pairs), free, or evictable (unreferenced but still registered, so a
    later ``allocate`` can reuse it). ``num_free_blocks`` counts free and evictable blocks: a
    new block is taken from the free ones first (least recently freed first), and only when
    none is left is the least recently freed evictable block evicted (its key forgotten).

    With ``enable_prefix_caching``, ``commit_computed`` registers a sequence's full blocks once
    their tokens are computed, under a ``BlockHash`` (the block's token ids chained to the key
    of the block before it; exact, never a false hit). ``allocate`` reuses the longest run of
    registered blocks from a sequence's first block. Only committed blocks are ever hit, so
    sequences admitted in the same step never share blocks that are not computed yet.

    NOTE: a full hit (every token in registered blocks) still runs the last token to get its
    logits, so ``num_computed_tokens == len(token_ids) - 1`` and that token's K/V is written
    again into the last block, which stays shared. The write stores what the slot already
    holds (same token after the same prefix, up to the batch's floating-point order), so a
    shared block that has a key (full and computed) is never copied on write; a shared block
    without one (after ``fork``) is.

    ``allocate`` and ``append_slots`` raise ``OutOfBlocksError`` and change nothing when the
    matching ``can_*`` is false. Not thread-safe: one engine thread owns it.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks: Final = num_blocks
        self.block_size: Final = block_size
        self.enable_prefix_caching: Final = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._block_hashes: list[BlockHash | None] = [None] * num_blocks
        self._cached_block_ids: dict[BlockHash, int] = {}
        self._free_block_ids: deque[int] = deque(range(num_blocks))
        self._evictable_block_ids: OrderedDict[int, None] = OrderedDict()
        self._num_queried_tokens = 0
        self._num_hit_tokens = 0
        self._num_evicted_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free plus evictable."""
        return len(self._free_block_ids) + len(self._evictable_block_ids)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the pool referenced, 0.0 for an empty pool."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(
            num_queried_tokens=self._num_queried_tokens,
            num_hit_tokens=self._num_hit_tokens,
            num_evicted_blocks=self._num_evicted_blocks,
        )

    def num_blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens (a sequence longer than the pool never fits)."""
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        """How many (sequence, position) pairs reference ``block_id``."""
        return self._ref_counts[block_id]

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether ``allocate(seq)`` would succeed now."""
        hit_block_ids = self._find_cached_prefix(seq)
        return self._num_missing_blocks(seq, hit_block_ids) <= 0

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` (holding no blocks) blocks for all of ``token_ids``.

        Reused cached blocks set ``num_cached_tokens`` to the tokens they hold and
        ``num_computed_tokens`` to the same, or to ``len(token_ids) - 1`` on a full hit; with
        no hit both are 0. Raises ``OutOfBlocksError`` (nothing changed) when it does not fit.
        """
        if seq.block_table:
            raise ValueError(f"{seq!r} already holds blocks; free it before allocating again")
        hit_block_ids = self._find_cached_prefix(seq)
        num_missing_blocks = self._num_missing_blocks(seq, hit_block_ids)
        if num_missing_blocks > 0:
            raise OutOfBlocksError(f"{seq!r} needs {num_missing_blocks} more free blocks")
        for block_id in hit_block_ids:
            self._take_reference(block_id)
        num_new_blocks = self.num_blocks_for_tokens(seq.num_tokens) - len(hit_block_ids)
        new_block_ids = [self._take_free_block() for _ in range(num_new_blocks)]
        seq.block_table = hit_block_ids + new_block_ids
        num_hit_tokens = len(hit_block_ids) * self.block_size
        seq.num_cached_tokens = num_hit_tokens
        # NOTE: a full hit still runs the last token, whose logits give the first output token.
        seq.num_computed_tokens = min(num_hit_tokens, max(seq.num_tokens - 1, 0))
        if self.enable_prefix_caching:
            self._num_queried_tokens += seq.num_tokens
            self._num_hit_tokens += num_hit_tokens

    def can_append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether ``append_slots(seq, num_new_tokens)`` would succeed now."""
        copy_indices, num_new_blocks = self._plan_append(seq, num_new_tokens)
        return len(copy_indices) + num_new_blocks <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make ``seq.block_table`` cover ``num_computed_tokens + num_new_tokens`` tokens.

        Those next tokens' slots are the ones the coming step writes. Each written block that
        other sequences share and that has no registered key is replaced in ``seq`` by a new
        block; the returned ``(src_block, dst_block)`` pairs, in table order, must be copied
        before the step runs. Raises ``OutOfBlocksError`` (nothing changed) when it does not fit.
        """
        copy_indices, num_new_blocks = self._plan_append(seq, num_new_tokens)
        num_missing_blocks = len(copy_indices) + num_new_blocks - self.num_free_blocks
        if num_missing_blocks > 0:
            raise OutOfBlocksError(f"{seq!r} needs {num_missing_blocks} more free blocks")
        copies: list[tuple[int, int]] = []
        for index in copy_indices:
            src_block_id = seq.block_table[index]
            dst_block_id = self._take_free_block()
            self._drop_reference(src_block_id)
            seq.block_table[index] = dst_block_id
            copies.append((src_block_id, dst_block_id))
        seq.block_table.extend(self._take_free_block() for _ in range(num_new_blocks))
        return copies

    def commit_computed(self, seq: Sequence) -> None:
        """Register ``seq``'s full blocks within ``num_computed_tokens``, after a step ran.

        A block whose key another block already holds stays unregistered (its key is kept for
        chaining, and it is registered when freed if the other block was evicted by then).
        Without prefix caching this does nothing.
        """
        if not self.enable_prefix_caching:
            return
        num_full_blocks = min(
            min(seq.num_computed_tokens, seq.num_tokens) // self.block_size, len(seq.block_table)
        )
        first_unkeyed_index = num_full_blocks
        while (
            first_unkeyed_index > 0
            and self._block_hashes[seq.block_table[first_unkeyed_index - 1]] is None
        ):
            first_unkeyed_index -= 1
        parent = (
            self._block_hashes[seq.block_table[first_unkeyed_index - 1]]
            if first_unkeyed_index
            else None
        )
        for index in range(first_unkeyed_index, num_full_blocks):
            block_id = seq.block_table[index]
            start = index * self.block_size
            block_hash = BlockHash(parent, seq.block_key(start, start + self.block_size))
            holder_block_id = self._cached_block_ids.setdefault(block_hash, block_id)
            if holder_block_id == block_id:
                parent = block_hash
            else:
                parent = self._block_hashes[holder_block_id]
            self._block_hashes[block_id] = parent

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let ``child`` (holding no blocks, same tokens so far) share all of ``parent``'s blocks.

        Sets ``child.num_computed_tokens`` to the parent's. The first write into a shared block
        that is not registered copies it (see ``append_slots``).
        """
        if child.block_table:
            raise ValueError(f"{child!r} already holds blocks; cannot fork into it")
        num_computed_tokens = parent.num_computed_tokens
        if child.token_ids[:num_computed_tokens] != parent.token_ids[:num_computed_tokens]:
            raise ValueError(f"{child!r} does not start with the computed tokens of {parent!r}")
        for block_id in parent.block_table:
            self._ref_counts[block_id] += 1
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = num_computed_tokens

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references, last block first; ``seq`` ends with no blocks and 0 computed.

        An unreferenced block becomes evictable if it has a registered key, else free. Freeing a
        sequence that holds no blocks does nothing.
        """
        for block_id in reversed(seq.block_table):
            self._drop_reference(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Drop every cached block that no sequence holds: evictable blocks become free (least
        recently freed first) and their keys are forgotten. On an idle pool nothing is hit after.

        Blocks still referenced keep their keys: wiping them would let one sharer's next commit
        key a block behind another sharer's unkeyed one, and keyed blocks must stay a prefix of
        every table that holds them.
        """
        for block_id in self._evictable_block_ids:
            block_hash = self._block_hashes[block_id]
            assert block_hash is not None
            del self._cached_block_ids[block_hash]
            self._block_hashes[block_id] = None
        self._free_block_ids.extend(self._evictable_block_ids)
        self._evictable_block_ids.clear()

    def check_invariants(self, seqs: Iterable[Sequence]) -> None:
        """Raise ``AssertionError`` unless the books balance; ``seqs`` must hold every table.

        Checks: every block is exactly one of referenced / free / evictable; reference counts
        equal the (sequence, position) pairs naming the block; no id outside the pool; the
        registry and the evictable blocks agree; each sequence's keyed blocks are a prefix of its
        table, fully computed, and keyed by exactly its own tokens.
        """
        references = [0] * self.num_blocks
        for seq in seqs:
            for block_id in seq.block_table:
                _require(0 <= block_id < self.num_blocks, f"{seq!r} holds block {block_id}")
                references[block_id] += 1
            self._check_keys(seq)
        free = set(self._free_block_ids)
        evictable = set(self._evictable_block_ids)
        _require(len(free) == len(self._free_block_ids), "a block is free twice")
        _require(free | evictable <= set(range(self.num_blocks)), "a free id is outside the pool")
        for block_id in range(self.num_blocks):
            num_states = (references[block_id] > 0) + (block_id in free) + (block_id in evictable)
            _require(num_states == 1, f"block {block_id} is in {num_states} states")
            _require(
                self._ref_counts[block_id] == references[block_id],
                f"block {block_id}: count {self._ref_counts[block_id]}, "
                f"referenced {references[block_id]} times",
            )
            block_hash = self._block_hashes[block_id]
            is_registered = (
                block_hash is not None and self._cached_block_ids.get(block_hash) == block_id
            )
            if block_id in free:
                _require(block_hash is None, f"free block {block_id} keeps a key")
            if block_id in evictable:
                _require(is_registered, f"evictable block {block_id} is not registered")
        for block_hash, block_id in self._cached_block_ids.items():
            _require(
                self._block_hashes[block_id] is block_hash,
                f"registered block {block_id} holds another key",
            )

    def _check_keys(self, seq: Sequence) -> None:
        parent: BlockHash | None = None
        num_keyed_blocks = 0
        for index, block_id in enumerate(seq.block_table):
            block_hash = self._block_hashes[block_id]
            if block_hash is None:
                break
            start = index * self.block_size
            expected = BlockHash(parent, seq.block_key(start, start + self.block_size))
            _require(block_hash == expected, f"{seq!r}: block {block_id} keyed for other tokens")
            _require(
                start + self.block_size <= seq.num_computed_tokens + 1,
                f"{seq!r}: block {block_id} keyed but not computed",
            )
            parent = block_hash
            num_keyed_blocks += 1
        for block_id in seq.block_table[num_keyed_blocks:]:
            _require(self._block_hashes[block_id] is None, f"{seq!r}: keyed blocks are no prefix")

    def _find_cached_prefix(self, seq: Sequence) -> list[int]:
        if not self.enable_prefix_caching or seq.reads_whole_prompt:
            return []
        hit_block_ids: list[int] = []
        parent: BlockHash | None = None
        for start in range(0, seq.num_tokens - self.block_size + 1, self.block_size):
            block_hash = BlockHash(parent, seq.block_key(start, start + self.block_size))
            block_id = self._cached_block_ids.get(block_hash)
            if block_id is None:
                break
            hit_block_ids.append(block_id)
            parent = self._block_hashes[block_id]
        if seq.whole_images:  # the rest of the prompt must not start inside an image
            while hit_block_ids and seq.image_cut_at(len(hit_block_ids) * self.block_size):
                hit_block_ids.pop()
        return hit_block_ids

    def _num_missing_blocks(self, seq: Sequence, hit_block_ids: list[int]) -> int:
        num_new_blocks = self.num_blocks_for_tokens(seq.num_tokens) - len(hit_block_ids)
        num_revived_blocks = sum(self._ref_counts[block_id] == 0 for block_id in hit_block_ids)
        return num_new_blocks - (self.num_free_blocks - num_revived_blocks)

    def _plan_append(self, seq: Sequence, num_new_tokens: int) -> tuple[list[int], int]:
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        num_tokens = seq.num_computed_tokens + num_new_tokens
        num_new_blocks = max(self.num_blocks_for_tokens(num_tokens) - len(seq.block_table), 0)
        first_index = seq.num_computed_tokens // self.block_size
        end_index = min(self.num_blocks_for_tokens(num_tokens), len(seq.block_table))
        written_indices = range(first_index, end_index) if num_new_tokens else range(0)
        copy_indices = [
            index
            for index in written_indices
            if self._ref_counts[seq.block_table[index]] > 1
            and self._block_hashes[seq.block_table[index]] is None
        ]
        return copy_indices, num_new_blocks

    def _take_reference(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            del self._evictable_block_ids[block_id]
        self._ref_counts[block_id] += 1

    def _take_free_block(self) -> int:
        if self._free_block_ids:
            block_id = self._free_block_ids.popleft()
        else:
            block_id, _ = self._evictable_block_ids.popitem(last=False)
            block_hash = self._block_hashes[block_id]
            assert block_hash is not None
            del self._cached_block_ids[block_hash]
            self._block_hashes[block_id] = None
            self._num_evicted_blocks += 1
        self._ref_counts[block_id] = 1
        return block_id

    def _drop_reference(self, block_id: int) -> None:
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] > 0:
            return
        block_hash = self._block_hashes[block_id]
        if block_hash is not None and self._register(block_hash, block_id):
            self._evictable_block_ids[block_id] = None
        else:
            self._block_hashes[block_id] = None
            self._free_block_ids.append(block_id)

    def _register(self, block_hash: BlockHash, block_id: int) -> bool:
        return self._cached_block_ids.setdefault(block_hash, block_id) == block_id


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
