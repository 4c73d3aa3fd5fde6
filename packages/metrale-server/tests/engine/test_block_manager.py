"""BlockManager: exact block ids, reference counts and eviction order; a model-based machine."""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from metrale_server.engine.block_hash import BlockHash
from metrale_server.engine.block_manager import BlockManager, OutOfBlocksError, PrefixCacheStats
from metrale_server.engine.sequence import Sequence
from metrale_server.sampling.params import SamplingParams


def make_seq(seq_id: int, token_ids: Iterable[int]) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_id=f"request-{seq_id}",
        prompt_token_ids=tuple(token_ids),
        params=SamplingParams(),
        arrival_time=0.0,
    )


def run_step(manager: BlockManager, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
    """What the scheduler and runner do for one chunk: slots, the forward pass, commit."""
    copies = manager.append_slots(seq, num_new_tokens)
    seq.num_computed_tokens += num_new_tokens
    manager.commit_computed(seq)
    return copies


def prefill(manager: BlockManager, seq: Sequence) -> None:
    assert run_step(manager, seq, seq.num_uncomputed_tokens) == []


def decode(manager: BlockManager, seq: Sequence, token_id: int) -> list[tuple[int, int]]:
    seq.append_token(token_id)
    return run_step(manager, seq, 1)


def snapshot(manager: BlockManager, seqs: Iterable[Sequence]) -> object:
    seq_states = [
        (list(seq.block_table), seq.num_computed_tokens, seq.num_cached_tokens) for seq in seqs
    ]
    return copy.deepcopy(vars(manager)), seq_states


def assert_refused(
    manager: BlockManager, seqs: list[Sequence], action: Callable[[], object]
) -> None:
    before = snapshot(manager, seqs)
    with pytest.raises(OutOfBlocksError):
        action()
    assert snapshot(manager, seqs) == before


def test_allocate_append_free_without_prefix_caching() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=False)
    a = make_seq(0, range(10))
    manager.allocate(a)
    assert a.block_table == [0, 1, 2]
    assert (a.num_computed_tokens, a.num_cached_tokens) == (0, 0)
    assert (manager.num_used_blocks, manager.num_free_blocks, manager.usage) == (3, 5, 3 / 8)

    prefill(manager, a)
    assert a.num_computed_tokens == 10
    assert decode(manager, a, 10) == []
    assert decode(manager, a, 11) == []
    assert a.block_table == [0, 1, 2]
    decode(manager, a, 12)
    assert a.block_table == [0, 1, 2, 3]

    b = make_seq(1, range(5))
    manager.allocate(b)
    assert b.block_table == [4, 5]

    manager.free(a)
    assert (a.block_table, a.num_computed_tokens) == ([], 0)
    assert [manager.ref_count(block_id) for block_id in range(4)] == [0, 0, 0, 0]
    assert manager.num_used_blocks == 2

    # Untouched blocks first, then a's blocks in the order they were freed (last block first).
    c = make_seq(2, range(100, 120))
    manager.allocate(c)
    assert c.block_table == [6, 7, 3, 2, 1]
    manager.check_invariants([b, c])
    assert manager.stats == PrefixCacheStats()


def test_num_blocks_for_tokens() -> None:
    manager = BlockManager(4, 4, enable_prefix_caching=False)
    assert [manager.num_blocks_for_tokens(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_prefix_hit_of_two_full_blocks() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=True)
    a = make_seq(0, range(10))
    manager.allocate(a)
    prefill(manager, a)

    b = make_seq(1, [*range(8), 50, 51, 52])
    assert manager.can_allocate(b)
    manager.allocate(b)
    assert b.block_table == [0, 1, 3]
    assert (b.num_computed_tokens, b.num_cached_tokens) == (8, 8)
    assert [manager.ref_count(block_id) for block_id in range(4)] == [2, 2, 1, 1]
    assert manager.stats == PrefixCacheStats(num_queried_tokens=21, num_hit_tokens=8)
    assert manager.stats.hit_rate == 8 / 21
    assert run_step(manager, b, 3) == []

    c = make_seq(2, [0, 1, 2, 3, 9, 9, 9, 9])
    manager.allocate(c)
    assert c.block_table == [0, 4]
    assert c.num_computed_tokens == 4

    # Block 1's tokens after another first block: the chain differs, so nothing is hit.
    d = make_seq(3, [9, 9, 9, 8, 4, 5, 6, 7])
    manager.allocate(d)
    assert d.block_table == [5, 6]
    assert d.num_computed_tokens == 0
    manager.check_invariants([a, b, c, d])


def test_full_hit_recomputes_the_last_token_in_the_shared_block() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=True)
    a = make_seq(0, range(8))
    manager.allocate(a)
    prefill(manager, a)

    b = make_seq(1, range(8))
    manager.allocate(b)
    assert b.block_table == [0, 1]
    assert (b.num_computed_tokens, b.num_cached_tokens) == (7, 8)
    assert (manager.ref_count(0), manager.ref_count(1)) == (2, 2)

    assert manager.can_append_slots(b, 1)
    assert manager.append_slots(b, 1) == []
    assert b.block_table == [0, 1]
    assert (manager.ref_count(0), manager.ref_count(1)) == (2, 2)
    b.num_computed_tokens += 1
    manager.commit_computed(b)
    assert decode(manager, b, 99) == []
    assert b.block_table == [0, 1, 2]
    manager.check_invariants([a, b])

    # Freed (b's own block is plain free, the shared ones evictable), a full hit revives them.
    manager.free(b)
    manager.free(a)
    assert manager.num_free_blocks == 8
    c = make_seq(2, range(8))
    manager.allocate(c)
    assert c.block_table == [0, 1]
    assert c.num_computed_tokens == 7
    assert manager.num_free_blocks == 6
    manager.check_invariants([c])


def test_blocks_are_hit_only_after_commit() -> None:
    manager = BlockManager(10, 4, enable_prefix_caching=True)
    a = make_seq(0, range(8))
    b = make_seq(1, range(8))
    manager.allocate(a)
    manager.allocate(b)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    assert b.num_computed_tokens == 0

    manager.append_slots(a, 8)
    a.num_computed_tokens = 8
    c = make_seq(2, range(8))
    manager.allocate(c)
    assert (c.block_table, c.num_computed_tokens) == ([4, 5], 0)

    manager.commit_computed(a)
    d = make_seq(3, range(8))
    manager.allocate(d)
    assert (d.block_table, d.num_computed_tokens) == ([0, 1], 7)
    manager.check_invariants([a, b, c, d])


def test_chunked_prefill_registers_only_computed_full_blocks() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=True)
    a = make_seq(0, range(12))
    manager.allocate(a)
    run_step(manager, a, 6)
    b = make_seq(1, range(12))
    manager.allocate(b)
    assert (b.block_table, b.num_computed_tokens) == ([0, 3, 4], 4)

    run_step(manager, a, 6)
    c = make_seq(2, range(12))
    manager.allocate(c)
    assert (c.block_table, c.num_computed_tokens) == ([0, 1, 2], 11)
    manager.check_invariants([a, b, c])


def test_duplicate_blocks_stay_unregistered_until_the_registered_copy_is_evicted() -> None:
    manager = BlockManager(6, 2, enable_prefix_caching=True)
    a = make_seq(0, [1, 2, 3, 4])
    b = make_seq(1, [1, 2, 3, 4])
    manager.allocate(a)
    manager.allocate(b)
    prefill(manager, a)
    prefill(manager, b)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])

    manager.free(a)
    c = make_seq(2, [7, 7, 7, 7])
    manager.allocate(c)
    assert c.block_table == [4, 5]
    d = make_seq(3, [8, 8, 8, 8])
    manager.allocate(d)
    assert d.block_table == [1, 0]
    assert manager.stats.num_evicted_blocks == 2

    # a's copies are gone, so b's blocks take over their keys when b is freed.
    manager.free(b)
    e = make_seq(4, [1, 2, 3, 4])
    manager.allocate(e)
    assert (e.block_table, e.num_computed_tokens) == ([2, 3], 3)
    manager.check_invariants([c, d, e])


def test_freed_duplicates_become_plain_free_blocks() -> None:
    manager = BlockManager(6, 2, enable_prefix_caching=True)
    a = make_seq(0, [1, 2, 3, 4])
    b = make_seq(1, [1, 2, 3, 4])
    manager.allocate(a)
    manager.allocate(b)
    prefill(manager, a)
    prefill(manager, b)
    manager.free(b)
    c = make_seq(2, [7] * 8)
    manager.allocate(c)
    assert c.block_table == [4, 5, 3, 2]
    assert manager.stats.num_evicted_blocks == 0
    manager.check_invariants([a, c])


def test_fork_then_copy_on_write_of_the_shared_partial_block() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=True)
    parent = make_seq(0, range(6))
    manager.allocate(parent)
    prefill(manager, parent)
    child = make_seq(1, range(6))
    manager.fork(parent, child)
    assert (child.block_table, child.num_computed_tokens) == ([0, 1], 6)
    assert (manager.ref_count(0), manager.ref_count(1)) == (2, 2)

    assert decode(manager, parent, 6) == [(1, 2)]
    assert parent.block_table == [0, 2]
    assert [manager.ref_count(block_id) for block_id in range(3)] == [2, 1, 1]
    assert decode(manager, child, 60) == []
    assert child.block_table == [0, 1]
    manager.check_invariants([parent, child])


def test_fork_before_prefill_copies_every_written_shared_block() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=False)
    parent = make_seq(0, range(10))
    manager.allocate(parent)
    child = make_seq(1, range(10))
    manager.fork(parent, child)
    assert run_step(manager, child, 10) == [(0, 3), (1, 4), (2, 5)]
    assert (parent.block_table, child.block_table) == ([0, 1, 2], [3, 4, 5])
    assert [manager.ref_count(block_id) for block_id in range(6)] == [1] * 6
    manager.check_invariants([parent, child])


def test_fork_at_a_block_boundary_needs_no_copy() -> None:
    manager = BlockManager(8, 4, enable_prefix_caching=False)
    parent = make_seq(0, range(8))
    manager.allocate(parent)
    prefill(manager, parent)
    child = make_seq(1, range(8))
    manager.fork(parent, child)
    assert decode(manager, parent, 8) == []
    assert decode(manager, child, 80) == []
    assert (parent.block_table, child.block_table) == ([0, 1, 2], [0, 1, 3])
    manager.check_invariants([parent, child])


def test_lru_eviction_takes_the_tail_of_the_first_freed_sequence_first() -> None:
    manager = BlockManager(6, 2, enable_prefix_caching=True)
    a = make_seq(0, [1, 2, 3, 4])
    b = make_seq(1, [5, 6, 7, 8])
    manager.allocate(a)
    prefill(manager, a)
    manager.allocate(b)
    prefill(manager, b)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    manager.free(a)
    manager.free(b)
    assert manager.num_free_blocks == 6

    # Never-used blocks 4, 5 first, then the least recently freed cached block: a's tail.
    c = make_seq(2, [9] * 6)
    manager.allocate(c)
    assert c.block_table == [4, 5, 1]
    assert manager.stats.num_evicted_blocks == 1

    # a's head is still cached; its new block evicts b's tail (block 0 was revived first).
    a_again = make_seq(3, [1, 2, 3, 4])
    manager.allocate(a_again)
    assert a_again.block_table == [0, 3]
    assert (a_again.num_computed_tokens, a_again.num_cached_tokens) == (2, 2)
    assert manager.stats.num_evicted_blocks == 2

    # b's head is cached but reviving it leaves nothing for the second block.
    b_again = make_seq(4, [5, 6, 7, 8])
    assert not manager.can_allocate(b_again)
    assert_refused(manager, [c, a_again, b_again], lambda: manager.allocate(b_again))

    manager.free(c)
    manager.allocate(b_again)
    assert b_again.block_table == [2, 1]
    assert b_again.num_computed_tokens == 2
    manager.check_invariants([a_again, b_again])


def test_refused_allocation_and_append_change_nothing() -> None:
    manager = BlockManager(4, 4, enable_prefix_caching=False)
    a = make_seq(0, range(9))
    b = make_seq(1, range(5))
    manager.allocate(a)
    assert not manager.can_allocate(b)
    assert_refused(manager, [a, b], lambda: manager.allocate(b))
    assert (b.block_table, b.num_computed_tokens) == ([], 0)

    prefill(manager, a)
    for token_id in (9, 10, 11):
        decode(manager, a, token_id)
    decode(manager, a, 12)
    assert a.block_table == [0, 1, 2, 3]
    assert manager.num_free_blocks == 0
    assert manager.can_append_slots(a, 3)
    assert not manager.can_append_slots(a, 4)
    assert_refused(manager, [a], lambda: manager.append_slots(a, 4))

    manager.free(a)
    manager.allocate(b)
    assert b.block_table == [3, 2]


def test_refused_copy_on_write_changes_nothing() -> None:
    manager = BlockManager(2, 4, enable_prefix_caching=False)
    parent = make_seq(0, range(6))
    manager.allocate(parent)
    prefill(manager, parent)
    child = make_seq(1, range(6))
    manager.fork(parent, child)
    parent.append_token(6)
    assert not manager.can_append_slots(parent, 1)
    assert_refused(manager, [parent, child], lambda: manager.append_slots(parent, 1))


def test_free_twice_and_free_without_blocks_are_no_ops() -> None:
    manager = BlockManager(4, 2, enable_prefix_caching=True)
    a = make_seq(0, [1, 2, 3])
    b = make_seq(1, [1, 2, 3])
    manager.free(b)
    manager.allocate(a)
    prefill(manager, a)
    manager.free(a)
    before = snapshot(manager, [a, b])
    manager.free(a)
    manager.free(b)
    assert snapshot(manager, [a, b]) == before
    manager.check_invariants([a, b])
    assert manager.num_free_blocks == 4


def test_preempted_sequence_hits_its_own_prompt_and_output_blocks() -> None:
    manager = BlockManager(8, 2, enable_prefix_caching=True)
    a = make_seq(0, [1, 2, 3])
    manager.allocate(a)
    prefill(manager, a)
    decode(manager, a, 4)
    decode(manager, a, 5)
    assert a.block_table == [0, 1, 2]
    manager.free(a)

    manager.allocate(a)
    assert a.block_table == [0, 1, 3]
    assert (a.num_computed_tokens, a.num_cached_tokens) == (4, 4)
    manager.check_invariants([a])


def test_reset_prefix_cache_keeps_keyed_blocks_a_prefix_of_every_sharer() -> None:
    # s3 reaches s2's second block through s1's copy of the first; wiping keys of held blocks
    # would let s2's next commit key that second block behind s3's unkeyed first one.
    manager = BlockManager(5, 2, enable_prefix_caching=True)
    s1 = make_seq(1, [0] * 5)
    manager.allocate(s1)
    s2 = make_seq(2, [0] * 5)
    manager.fork(s1, s2)
    for seq, num_new in [(s1, 2), (s2, 4)]:
        manager.append_slots(seq, num_new)
    for seq, num_new in [(s1, 2), (s2, 4)]:
        seq.num_computed_tokens += num_new
        manager.commit_computed(seq)
    s3 = make_seq(3, [0, 0, 0, 0])
    manager.allocate(s3)
    assert s3.num_computed_tokens == 3
    manager.free(s1)
    manager.reset_prefix_cache()
    manager.append_slots(s2, 1)
    s2.num_computed_tokens += 1
    manager.commit_computed(s2)
    manager.check_invariants([s2, s3])


def test_reset_prefix_cache_drops_what_no_sequence_holds() -> None:
    manager = BlockManager(6, 2, enable_prefix_caching=True)
    a = make_seq(0, [1, 2, 3, 4])
    manager.allocate(a)
    prefill(manager, a)
    b = make_seq(1, [5, 6])
    manager.allocate(b)
    prefill(manager, b)
    manager.free(b)

    manager.reset_prefix_cache()
    manager.check_invariants([a])
    assert manager.num_free_blocks == 4
    # b's block is forgotten; a's blocks, still held, are hit.
    c = make_seq(2, [1, 2, 3, 4, 5, 6])
    manager.allocate(c)
    assert (c.block_table, c.num_computed_tokens) == ([0, 1, 3], 4)
    manager.check_invariants([a, c])

    manager.free(a)
    manager.free(c)
    manager.reset_prefix_cache()
    assert manager.num_free_blocks == 6
    d = make_seq(3, [1, 2, 3, 4])
    manager.allocate(d)
    assert d.num_computed_tokens == 0
    manager.check_invariants([d])


def test_without_prefix_caching_nothing_is_hit_or_counted() -> None:
    manager = BlockManager(4, 2, enable_prefix_caching=False)
    a = make_seq(0, [1, 2, 3, 4])
    manager.allocate(a)
    prefill(manager, a)
    b = make_seq(1, [1, 2, 3, 4])
    manager.allocate(b)
    assert (b.block_table, b.num_computed_tokens, b.num_cached_tokens) == ([2, 3], 0, 0)
    manager.free(a)
    manager.free(b)
    assert manager.stats == PrefixCacheStats()
    assert manager.stats.hit_rate == 0.0


def test_misuse_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(-1, 4, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0, enable_prefix_caching=False)
    manager = BlockManager(8, 4, enable_prefix_caching=False)
    a = make_seq(0, range(5))
    manager.allocate(a)
    with pytest.raises(ValueError, match="already holds blocks"):
        manager.allocate(a)
    with pytest.raises(ValueError, match="num_new_tokens"):
        manager.append_slots(a, -1)
    prefill(manager, a)
    with pytest.raises(ValueError, match="already holds blocks"):
        manager.fork(make_seq(1, range(5)), a)
    with pytest.raises(ValueError, match="computed tokens"):
        manager.fork(a, make_seq(2, [0, 1, 2, 3, 99]))


def test_check_invariants_catches_unbalanced_books() -> None:
    manager = BlockManager(4, 2, enable_prefix_caching=False)
    a = make_seq(0, [1, 2, 3])
    b = make_seq(1, [1, 2, 3])
    manager.allocate(a)
    manager.fork(a, b)
    manager.check_invariants([a, b])
    with pytest.raises(AssertionError, match="count 2, referenced 1 times"):
        manager.check_invariants([a])
    stray = make_seq(2, [1])
    stray.block_table = [4]
    with pytest.raises(AssertionError, match="holds block 4"):
        manager.check_invariants([a, b, stray])
    stray.block_table = [3]
    with pytest.raises(AssertionError, match="block 3 is in 2 states"):
        manager.check_invariants([a, b, stray])


def test_block_hash_equality_is_exact_and_iterative() -> None:
    first = BlockHash(None, (1, 2))
    assert BlockHash(first, (3, 4)) == BlockHash(BlockHash(None, (1, 2)), (3, 4))
    assert hash(BlockHash(first, (3, 4))) == hash(BlockHash(BlockHash(None, (1, 2)), (3, 4)))
    assert BlockHash(first, (3, 4)) != BlockHash(BlockHash(None, (1, 9)), (3, 4))
    assert BlockHash(first, (3, 4)) != BlockHash(None, (3, 4))
    assert BlockHash(None, (1, 2)) != (1, 2)
    assert "1, 2" not in repr(first)

    left: BlockHash | None = None
    right: BlockHash | None = None
    for block in range(5_000):
        left = BlockHash(left, (block, 0))
        right = BlockHash(right, (block, 0))
    assert left == right
    assert left != BlockHash(right, (0, 0))


class BlockManagerMachine(RuleBasedStateMachine):
    """Random admissions, batched steps, forks, finishes, preemptions and resets, small pools.

    ``kv`` models the pool's contents: each slot holds the token prefix whose K/V it stores.
    After every rule, every computed position of every live sequence must read its own prefix.
    """

    def __init__(self) -> None:
        super().__init__()
        self.running: list[Sequence] = []
        self.preempted: list[Sequence] = []
        self.seq_ids = itertools.count()
        self.last_stats = PrefixCacheStats()

    @initialize(
        num_blocks=st.integers(1, 16),
        block_size=st.integers(1, 4),
        enable_prefix_caching=st.booleans(),
    )
    def build(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching=enable_prefix_caching
        )
        self.kv: list[list[tuple[int, ...] | None]] = [
            [None] * block_size for _ in range(num_blocks)
        ]

    def admit(self, seq: Sequence) -> None:
        if self.manager.can_allocate(seq):
            self.manager.allocate(seq)
            self.running.append(seq)
            assert seq.num_computed_tokens < seq.num_tokens
        else:
            assert_refused(self.manager, [*self.running, seq], lambda: self.manager.allocate(seq))
            self.preempted.append(seq)

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=8))
    def add(self, prompt: list[int]) -> None:
        self.admit(make_seq(next(self.seq_ids), prompt))

    @precondition(lambda self: self.running or self.preempted)
    @rule(data=st.data())
    def add_sharing_a_prefix(self, data: st.DataObject) -> None:
        source = data.draw(st.sampled_from(self.running + self.preempted))
        num_shared = data.draw(st.integers(1, source.num_tokens))
        tail = data.draw(st.lists(st.integers(0, 2), max_size=4))
        self.admit(make_seq(next(self.seq_ids), [*source.token_ids[:num_shared], *tail]))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One model step over a batch: all slots and copies first, then writes, then commits."""
        batch = data.draw(st.lists(st.sampled_from(self.running), min_size=1, unique=True))
        scheduled: list[tuple[Sequence, int]] = []
        copies: list[tuple[int, int]] = []
        for seq in batch:
            if seq.num_uncomputed_tokens == 0:
                seq.append_token(data.draw(st.integers(0, 2)))
            num_new = data.draw(st.integers(1, seq.num_uncomputed_tokens))
            if self.manager.can_append_slots(seq, num_new):
                copies += self.manager.append_slots(seq, num_new)
                scheduled.append((seq, num_new))
            else:
                refused = functools.partial(self.manager.append_slots, seq, num_new)
                assert_refused(self.manager, self.running, refused)
        for src, dst in copies:
            self.kv[dst] = list(self.kv[src])
        block_size = self.manager.block_size
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            for position in range(start, start + num_new):
                block_id = seq.block_table[position // block_size]
                slot = self.kv[block_id]
                value = tuple(seq.token_ids[: position + 1])
                if self.manager.ref_count(block_id) > 1:
                    assert slot[position % block_size] == value, "a write changed a shared block"
                slot[position % block_size] = value
        for seq, num_new in scheduled:
            seq.num_computed_tokens += num_new
            if data.draw(st.booleans()):
                self.manager.commit_computed(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.running))
        child = make_seq(next(self.seq_ids), parent.prompt_token_ids)
        child.token_ids = list(parent.token_ids)
        self.manager.fork(parent, child)
        self.running.append(child)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), reset_prefix_cache=st.integers(0, 3).map(lambda draw: draw == 0))
    def finish(self, data: st.DataObject, reset_prefix_cache: bool) -> None:
        seq = data.draw(st.sampled_from(self.running))
        self.running.remove(seq)
        self.manager.free(seq)
        self.manager.free(seq)
        if reset_prefix_cache:
            self.manager.reset_prefix_cache()

    @precondition(lambda self: self.running)
    @rule(data=st.data(), readmit=st.booleans())
    def preempt(self, data: st.DataObject, readmit: bool) -> None:
        seq = data.draw(st.sampled_from(self.running))
        self.running.remove(seq)
        self.manager.free(seq)
        if readmit:
            self.admit(seq)
        else:
            self.preempted.append(seq)

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.preempted))
        self.preempted.remove(seq)
        self.admit(seq)

    @invariant()
    def books_balance(self) -> None:
        manager = self.manager
        manager.check_invariants(self.running)
        held = {block_id for seq in self.running for block_id in seq.block_table}
        assert manager.num_used_blocks == len(held)
        assert manager.num_free_blocks + len(held) == manager.num_blocks
        assert all(not seq.block_table for seq in self.preempted)
        stats = manager.stats
        assert stats.num_queried_tokens >= self.last_stats.num_queried_tokens
        assert stats.num_hit_tokens >= self.last_stats.num_hit_tokens
        assert stats.num_evicted_blocks >= self.last_stats.num_evicted_blocks
        self.last_stats = stats

    @invariant()
    def computed_positions_hold_their_own_prefix(self) -> None:
        block_size = self.manager.block_size
        for seq in self.running:
            assert len(seq.block_table) * block_size >= seq.num_computed_tokens
            for position in range(seq.num_computed_tokens):
                block_id = seq.block_table[position // block_size]
                expected = tuple(seq.token_ids[: position + 1])
                assert self.kv[block_id][position % block_size] == expected


BlockManagerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
test_block_manager_machine = BlockManagerMachine.TestCase


def test_machine_invariant_can_fail() -> None:
    machine: Any = BlockManagerMachine()
    machine.build(num_blocks=4, block_size=2, enable_prefix_caching=True)
    machine.add([1, 2, 3])
    machine.kv[0][0] = (7,)
    machine.running[0].num_computed_tokens = 1
    with pytest.raises(AssertionError):
        machine.computed_positions_hold_their_own_prefix()
