"""The tiny random BERT of the fast test tier (HF BertModelTester-style sizes), shared by tests.

``TINY`` holds the sizes; :func:`save_tiny_checkpoint` writes a complete Hugging Face folder
from them (config, ``model.safetensors``, a WordPiece tokenizer whose vocabulary has exactly
``vocab_size`` entries). Tests get it through the session fixture ``tiny_checkpoint``
(``conftest.py``); build one yourself only for a second, different model
(``tiny_checkpoint_factory(seed=1)``).
"""

from __future__ import annotations

import json
from pathlib import Path

#: keyword arguments for ``transformers.BertConfig`` / ``bertattn.BertConfig``
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=128,
    type_vocab_size=2,
)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# whole words (so common test sentences stay short), then characters: any lowercase ASCII word
# tokenizes without [UNK], as whole words or single letters + ##letters
_WORDS = (
    "the attention head looks at every token in sentence and weighs it on is of to "
    "bert model layer text line word hello first second ok"
).split()


def tiny_vocab(size: int = TINY["vocab_size"]) -> list[str]:
    """A WordPiece vocabulary of exactly ``size`` entries (``[PAD]`` is id 0)."""
    pieces = [*SPECIAL_TOKENS, *".,'!?-", *_LETTERS, *(f"##{c}" for c in _LETTERS)]
    pieces += [*"0123456789", *_WORDS]
    if size < len(SPECIAL_TOKENS) + 6 + 2 * len(_LETTERS):
        raise ValueError(f"vocab_size={size} cannot hold the specials, punctuation and letters")
    vocab = pieces[:size]
    vocab += [f"[unused{i}]" for i in range(size - len(vocab))]
    assert len(set(vocab)) == len(vocab) == size
    return vocab


def tiny_bertattn(seed: int = 0, **kw: object):  # type: ignore[no-untyped-def]
    """A ``bertattn.BertModel`` of ``TINY`` sizes in eval mode (``kw``: its constructor's
    keywords, e.g. ``backend``), every parameter moved by N(0, 0.1) noise from ``seed`` so that
    LayerNorms and biases are not the identity and zeros they start as."""
    import torch

    from bertattn import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig(**TINY), **kw).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def save_tiny_checkpoint(folder: str | Path, seed: int = 0, **overrides: object) -> Path:
    """Write a random ``transformers.BertModel`` of ``TINY`` sizes (``overrides`` on top) and
    its tokenizer to ``folder``. Every parameter, LayerNorms included, gets N(0, 0.1) noise
    from ``seed``, so a swapped or dropped tensor cannot pass a comparison."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = transformers.BertConfig(**{**TINY, **overrides})
    save_random(transformers.BertModel, config, folder, seed)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(tiny_vocab(config.vocab_size)) + "\n", encoding="utf-8")
    # tokenizer.json from the `tokenizers` library (what transformers 4 and 5 both read)
    from tokenizers.implementations import BertWordPieceTokenizer

    BertWordPieceTokenizer(str(vocab), lowercase=True).save(str(folder / "tokenizer.json"))
    names = ["pad_token", "unk_token", "cls_token", "sep_token", "mask_token"]
    tok_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "model_max_length": config.max_position_embeddings,
        **dict(zip(names, SPECIAL_TOKENS, strict=True)),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return folder


def save_random(cls, config, folder: str | Path, seed: int = 0, tokenizer_from: Path | None = None):  # type: ignore[no-untyped-def]
    """``cls(config)`` (a transformers model class), every parameter moved by N(0, 0.1) noise
    from ``seed``, saved to ``folder`` with ``save_pretrained`` (and the tokenizer files of
    ``tokenizer_from``, when given); the model, in eval mode."""
    import shutil

    import torch

    torch.manual_seed(seed)
    model = cls(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(folder)
    if tokenizer_from is not None:
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
            if (Path(tokenizer_from) / name).exists():
                shutil.copy(Path(tokenizer_from) / name, Path(folder) / name)
    return model
