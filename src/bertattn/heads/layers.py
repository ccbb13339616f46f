"""The head layers: thin modules over the encoder's hidden states ``(..., E)``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import Tensor, nn

from ..blocks import activation
from ..errors import ModelFolderError
from ..families import registry as families
from .weights import read_head

__all__ = ["FirstTokenHead", "MaskedLMHead", "load_classifier", "load_masked_lm_head"]

_MLM = "cls.predictions."


def _linear(tensors: dict[str, Tensor], prefix: str) -> nn.Linear:
    out, width = tensors[f"{prefix}weight"].shape
    layer = nn.Linear(width, out)
    with torch.no_grad():
        layer.weight.copy_(tensors[f"{prefix}weight"])
        layer.bias.copy_(tensors[f"{prefix}bias"])
    return layer.eval()


def load_classifier(weights: Path, width: int, num_labels: int, what: str) -> nn.Linear:
    """``classifier.weight`` / ``.bias`` of ``weights`` as ``nn.Linear(width, num_labels)``
    (sequence and token classification both name it so)."""
    tensors = read_head(
        weights,
        {"classifier.weight": (num_labels, width), "classifier.bias": (num_labels,)},
        f"{what} head ({num_labels} labels)",
    )
    return _linear(tensors, "classifier.")


class FirstTokenHead(nn.Module):
    """A sequence classifier with a first-token layer of its own: ``dense -> act`` on the
    first token, then the classifier: ``(B, L, E) -> (B, num_labels)``. DistilBERT's
    (``pre_classifier``, ReLU) and ELECTRA's (``classifier.dense``, GELU); dropout is not
    applied at inference."""

    def __init__(self, dense: nn.Linear, act: str, classifier: nn.Linear) -> None:
        super().__init__()
        self.dense = dense
        self.act = activation(act)
        self.classifier = classifier

    def forward(self, hidden: Tensor) -> Tensor:
        return self.classifier(self.act(self.dense(hidden[:, 0].float())))

    @classmethod
    def load(
        cls, weights: Path, layer: tuple[str, str], width: int, num_labels: int
    ) -> FirstTokenHead:
        """The head of a checkpoint whose family record names its first-token ``layer``
        (:attr:`bertattn.families.registry.Family.first_token_layer`: prefix, activation)."""
        prefix, act = layer
        try:
            tensors = read_head(
                weights,
                {
                    f"{prefix}weight": (width, width),
                    f"{prefix}bias": (width,),
                    "classifier.weight": (num_labels, width),
                    "classifier.bias": (num_labels,),
                },
                f"sequence-classification head ({num_labels} labels)",
                pooler=prefix == "pooler.dense.",
            )
        except ModelFolderError as exc:
            if prefix != "pooler.dense.":
                raise
            # say the names the file uses (ELECTRA's), not BERT's it was read under
            msg = re.sub(r"\bclassifier\.(weight|bias)\b", r"classifier.out_proj.\1", str(exc))
            raise ModelFolderError(msg.replace("pooler.dense.", "classifier.dense.")) from None
        return cls(_linear(tensors, prefix), act, _linear(tensors, "classifier.")).eval()


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head: ``dense -> hidden_act -> LayerNorm`` (the transform), then the
    decoder to the vocabulary, its weight tied to the word embeddings (``(V, E)``), plus a
    bias: ``(..., E) -> (..., V)`` logits."""

    def __init__(self, width: int, hidden_act: str, eps: float, decoder: Tensor) -> None:
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.act = activation(hidden_act)
        self.norm = nn.LayerNorm(width, eps=eps)
        self.decoder = decoder  # (V, E): the word embeddings (tied) or the file's own
        self.bias = nn.Parameter(torch.zeros(decoder.shape[0]))

    def transform(self, hidden: Tensor) -> Tensor:
        """``(..., E) -> (..., E)``: the layers before the decoder."""
        return self.norm(self.act(self.dense(hidden)))

    def decode(self, transformed: Tensor) -> Tensor:
        """``(..., E) -> (..., V)`` logits of transformed states."""
        return torch.nn.functional.linear(transformed, self.decoder, self.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decode(self.transform(hidden.float()))


def load_masked_lm_head(model_dir: Path, weights: Path, bert: object) -> MaskedLMHead:
    """The masked-LM head of a ``BertForMaskedLM`` folder, on ``bert`` (a
    :class:`bertattn.Bert`) whose word embeddings the decoder shares (unless config.json says
    ``tie_word_embeddings: false``, when the file's ``cls.predictions.decoder.weight`` is
    used)."""
    cfg = bert.model.config  # type: ignore[attr-defined]
    width, vocab = cfg.hidden_size, cfg.vocab_size
    own = families.get(cfg.family).heads.get("masked-lm")
    if own is not None:  # the family's own head (ModernBERT's), on the same two steps
        tensors = read_head(
            weights, own.expected(cfg, vocab), "masked-LM head", optional=own.optional(cfg, vocab)
        )
        words = bert.model.embeddings.word.weight.detach().float()  # type: ignore[attr-defined]
        return own.build(cfg, vocab, {**tensors, "@word_embeddings": words})  # type: ignore[return-value]
    raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    tied = raw.get("tie_word_embeddings", True) is not False
    tensors = read_head(
        weights,
        {
            f"{_MLM}transform.dense.weight": (width, width),
            f"{_MLM}transform.dense.bias": (width,),
            f"{_MLM}transform.LayerNorm.weight": (width,),
            f"{_MLM}transform.LayerNorm.bias": (width,),
            f"{_MLM}bias": (vocab,),
        },
        "masked-LM head",
        optional={f"{_MLM}decoder.weight": (vocab, width), f"{_MLM}decoder.bias": (vocab,)},
    )
    if tied:
        decoder = bert.model.embeddings.word.weight.detach().float()  # type: ignore[attr-defined]
    elif f"{_MLM}decoder.weight" in tensors:
        decoder = tensors[f"{_MLM}decoder.weight"]
    else:
        raise ModelFolderError(
            f"{weights}: config.json sets tie_word_embeddings false but there is no "
            f"{_MLM}decoder.weight; the checkpoint is incomplete."
        )
    head = MaskedLMHead(width, cfg.hidden_act, cfg.layer_norm_eps, decoder)
    with torch.no_grad():
        head.dense.weight.copy_(tensors[f"{_MLM}transform.dense.weight"])
        head.dense.bias.copy_(tensors[f"{_MLM}transform.dense.bias"])
        head.norm.weight.copy_(tensors[f"{_MLM}transform.LayerNorm.weight"])
        head.norm.bias.copy_(tensors[f"{_MLM}transform.LayerNorm.bias"])
        head.bias.copy_(tensors[f"{_MLM}bias"])
    return head.eval()
