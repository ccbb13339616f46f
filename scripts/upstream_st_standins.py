"""Local stand-ins for the hub models sentence-transformers' head tests load, so the tests run
offline: tiny random BERTs made by transformers, wrapped and saved by sentence-transformers' own
classes, written into a Hugging Face hub cache (``models--org--name/snapshots/<rev>/`` and
``refs/main``) under the ids the tests ask for. Their outputs are random: tests that compare
with a real checkpoint's numbers fail here upstream too, and are left out of the counts.

Used by ``scripts/upstream_st_tests.py``; a measurement tool, not part of the test suite.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

#: the revision every stand-in is stored under (the cache's ``refs/main``)
REVISION = "0123456789abcdef0123456789abcdef01234567"
#: the sizes of the tiny BERTs (about bert-tiny's: 2 layers of 64)
SIZES = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
)
#: the tokenizer files copied into each stand-in
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
_TANH = "torch.nn.modules.activation.Tanh"
_SIGMOID = "torch.nn.modules.activation.Sigmoid"


def _hf_folder(out: Path, tokenizer: Path, head: str, seed: int, **config: object) -> Path:
    """A transformers folder in ``out``: a random ``Bert<head>`` (``""``: the bare encoder)
    of :data:`SIZES` and ``config``'s fields, with ``tokenizer``'s files."""
    import torch
    import transformers

    vocab = len((tokenizer / "vocab.txt").read_text(encoding="utf-8").splitlines())
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=vocab, **SIZES, **config)
    getattr(transformers, f"Bert{head or 'Model'}")(cfg).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, out / name)
    return out


def _edit_config(folder: Path, **fields: object) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}, indent=2))


def _dense(out: Path, work: Path, tok: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    module = Transformer(str(_hf_folder(work, tok, "", 1)))
    SentenceTransformer(modules=[module, Pooling(SIZES["hidden_size"])]).save(str(out))


def _reranker(labels: dict[int, str] | None = None, seed: int = 2) -> Callable[..., None]:
    def make(out: Path, work: Path, tok: Path) -> None:
        from sentence_transformers import CrossEncoder

        extra = (
            {"id2label": labels, "label2id": {v: k for k, v in labels.items()}} if labels else {}
        )
        hf = _hf_folder(
            work, tok, "ForSequenceClassification", seed, num_labels=len(labels or [0]), **extra
        )
        CrossEncoder(str(hf)).save_pretrained(str(out))

    return make


def _legacy_reranker(fields: dict[str, object]) -> Callable[..., None]:
    """A reranker as older sentence-transformers saved it: a plain transformers folder, the
    activation in ``config.json``."""

    def make(out: Path, work: Path, tok: Path) -> None:
        _hf_folder(out, tok, "ForSequenceClassification", 3, num_labels=1)
        _edit_config(out, **fields)

    return make


def _splade(out: Path, work: Path, tok: Path) -> None:
    from sentence_transformers import SparseEncoder

    SparseEncoder(str(_hf_folder(work, tok, "ForMaskedLM", 4))).save_pretrained(str(out))


def _inference_free(out: Path, work: Path, tok: Path) -> None:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import (
        MLMTransformer,
        SparseStaticEmbedding,
        SpladePooling,
    )

    document = MLMTransformer(str(_hf_folder(work, tok, "ForMaskedLM", 5)))
    query = SparseStaticEmbedding(document.tokenizer, frozen=False)
    router = Router.for_query_document(
        query_modules=[query], document_modules=[document, SpladePooling("max")]
    )
    SparseEncoder(modules=[router], similarity_fn_name="dot").save_pretrained(str(out))


#: hub id -> how its stand-in is made (``make(out, work, tokenizer)``)
STANDINS: dict[str, Callable[[Path, Path, Path], None]] = {
    "sentence-transformers-testing/stsb-bert-tiny-safetensors": _dense,
    "cross-encoder-testing/reranker-bert-tiny-gooaq-bce": _reranker(),
    "cross-encoder-testing/reranker-bert-tiny-gooaq-bce-STv54": _legacy_reranker(
        {"sentence_transformers": {"activation_fn": _SIGMOID, "version": "5.4.0"}}
    ),
    "cross-encoder-testing/reranker-bert-tiny-gooaq-bce-tanh-v3": _legacy_reranker(
        {"sbert_ce_default_activation_function": _TANH}
    ),
    "cross-encoder-testing/reranker-bert-tiny-gooaq-bce-tanh-v4": _legacy_reranker(
        {"sentence_transformers": {"activation_fn": _TANH, "version": "4.0.1"}}
    ),
    "cross-encoder/nli-MiniLM2-L6-H768": _reranker(
        {0: "contradiction", 1: "entailment", 2: "neutral"}, seed=6
    ),
    "cross-encoder/stsb-distilroberta-base": _reranker(seed=7),
    "cross-encoder-testing/stsb-distilroberta-base": _reranker(seed=7),
    "distilbert/distilroberta-base": lambda out, work, tok: _hf_folder(out, tok, "ForMaskedLM", 8),
    "sparse-encoder-testing/splade-bert-tiny-nq": _splade,
    "sparse-encoder-testing/inference-free-splade-bert-tiny-nq": _inference_free,
}


def build_standins(cache: Path, tokenizer: Path) -> list[str]:
    """Write every stand-in of :data:`STANDINS` missing from ``cache`` (a hub cache folder);
    returns the ids written. ``tokenizer``: a folder with a BERT WordPiece tokenizer
    (``vocab.txt``, ``tokenizer.json``, ...), copied into each."""
    written = []
    for model_id, make in STANDINS.items():
        repo = cache / f"models--{model_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / REVISION
        if (repo / "refs" / "main").is_file():
            continue
        shutil.rmtree(repo, ignore_errors=True)
        snapshot.mkdir(parents=True)
        make(snapshot, repo / "work", tokenizer)
        shutil.rmtree(repo / "work", ignore_errors=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(REVISION)
        written.append(model_id)
    return written
