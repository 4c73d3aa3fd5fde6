"""``BlockHash``: the prefix-cache key of one full KV block, chained to the blocks before it."""

from __future__ import annotations

import attrs


@attrs.frozen(eq=False, repr=False)
class BlockHash:
    """Key of a full block: its token ids (then the digests of the images they reach:
    :meth:`Sequence.block_key`) and the key of the block before it (``None`` first).

    Two keys are equal exactly when the whole token prefixes they end are equal, so a lookup
    never returns a block computed for other tokens. The hash is computed once; equality
    walks the two chains without recursion and stops at the first shared parent, so keys built
    on the same parent object compare in O(block_size).
    """

    parent: BlockHash | None
    token_ids: tuple[int | str, ...]
    _hash: int = attrs.field(init=False)

    @_hash.default
    def _chain_hash(self) -> int:
        return hash((None if self.parent is None else self.parent._hash, self.token_ids))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockHash):
            return NotImplemented
        left: BlockHash | None = self
        right: BlockHash | None = other
        while left is not right:
            if left is None or right is None:
                return False
            if left._hash != right._hash or left.token_ids != right.token_ids:
                return False
            left, right = left.parent, right.parent
        return True

    def __repr__(self) -> str:
        # Never prints token ids: a prompt must not reach a log through a repr.
        return f"BlockHash({self._hash & 0xFFFFFFFFFFFFFFFF:016x})"
