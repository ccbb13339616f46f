"""Embeddings without positions, for the rotary encoders (their layers rotate instead): word
embeddings, token-type embeddings when the model has them, a norm and dropout; or word
embeddings scaled by a constant (Gemma's)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .tables import embedding

__all__ = ["ScaledTokenEmbeddings", "TokenEmbeddings"]


class TokenEmbeddings(nn.Module):
    """``(B, L)`` ids -> ``(B, L, E)``, or packed ``(T,)`` -> ``(T, E)``: ``word`` (+
    ``token_type``, None without token types), then ``norm`` and dropout. The signature of
    :class:`bertattn.families.bert_layers.BertEmbeddings` (positions are read past)."""

    def __init__(
        self,
        vocab: int,
        width: int,
        norm: nn.Module,
        *,
        padding_idx: int | None,
        token_types: int = 0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.word = embedding(vocab, width, padding_idx=padding_idx)
        self.token_type = embedding(token_types, width) if token_types else None
        self.norm = norm
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
    ) -> Tensor:
        x = self.words(input_ids) if inputs_embeds is None else inputs_embeds
        x = self.add_positions(x.to(self.word.weight.dtype), position_ids)  # (..., L, W)
        if self.token_type is not None:  # no ids: every token is segment 0
            types = self.token_type.weight
            x = x + (types[0] if token_type_ids is None else self.token_type(token_type_ids))
        return self.finish(x)

    def words(self, input_ids: Tensor) -> Tensor:
        """The word embeddings of ``input_ids``, ``(..., L)`` -> ``(..., L, W)``."""
        return self.word(input_ids)

    def add_positions(self, x: Tensor, position_ids: Tensor | None) -> Tensor:
        """``x`` ``(..., L, W)`` with the positions' embeddings added: none here."""
        return x

    def finish(self, x: Tensor) -> Tensor:
        """The norm, then dropout."""
        return self.dropout(self.norm(x))


class ScaledTokenEmbeddings(TokenEmbeddings):
    """Word embeddings multiplied by ``scale`` (Gemma's ``sqrt(E)``), the factor rounded to the
    table's dtype first as the checkpoint's own code does: ``(B, L)`` ids -> ``(B, L, E)``, or
    packed ``(T,)`` -> ``(T, E)``. No positions, no token types, no norm. ``inputs_embeds``,
    when given, are taken as they are (not scaled), as transformers takes them."""

    def __init__(self, vocab: int, width: int, scale: float, *, padding_idx: int | None) -> None:
        super().__init__(vocab, width, nn.Identity(), padding_idx=padding_idx)
        self.scale = float(scale)

    def words(self, input_ids: Tensor) -> Tensor:
        """The word embeddings times the scale (rounded to the table's dtype)."""
        table = self.word.weight
        factor = torch.tensor(self.scale, dtype=table.dtype, device=table.device)
        return self.word(input_ids) * factor  # (..., E)
