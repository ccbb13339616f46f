"""A BERT encoder built on :class:`bertattn.MultiHeadAttention`. Read top to bottom:

    input_ids (B, L) --embeddings--> hidden (B, L, E)
        --N x [attention + residual + LayerNorm, MLP + residual + LayerNorm]--> (B, L, E)
        --pooler (dense + tanh on [CLS])--> (B, E)

B batch, L sequence length, E hidden_size, H heads, I intermediate_size.
The padding mask is prepared once per forward and shared by every layer. With the ``varlen``
backend (or ``auto`` on a padded batch) the real tokens are packed once after the input ids are
read, every layer works on ``(T, E)`` (T = real tokens), and the result is padded once at the end.
When every layer is the stock class in eval mode without hooks (and nothing records steps or
asks for weights), the encoder runs each layer as one sequence of tensor ops
(``BertLayer.forward(..., lean=True)``): the same ops in the same order, without the module
calls.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..arguments import (
    ArgumentTypeError,
    check_bool,
    check_dtype,
    check_id_range,
    check_int,
    check_str,
    check_tensor,
    describe,
    is_int,
)
from ..attention import MultiHeadAttention, PreparedMask, get_backend, prepare_mask
from ..attention import dispatch as _dispatch
from ..attention import fastcall as _fast
from ..attention import gemm as _gemm
from ..attention import prepack as _prepack
from ..attention import steps as _steps
from ..attention.dispatch import choose_backend
from ..attention.padding import PackedBatch, pack_padding_mask, pad, unpad
from ..blocks import relative as _relative
from ..blocks.tables import embedding
from ..capture import is_capturing
from ..runtime import workers as _workers
from . import chunks as _chunks
from . import fused as _fused
from .config import BertConfig

if TYPE_CHECKING:
    from .folder import ModelFolder

__all__ = ["BertModel", "BertModelOutput", "BertEncoder", "BertLayer", "BertEmbeddings"]


def activation(name: str):  # type: ignore[no-untyped-def]
    """The function behind a Hugging Face ``hidden_act`` name."""
    if name == "gelu":
        return F.gelu  # exact (erf) GELU, as in the original BERT
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unsupported hidden_act {name!r}")


def _warn_if_slow_half(dtype: torch.dtype, device: torch.device) -> None:
    """Half-precision GEMMs on a CPU without native bf16/fp16 units are emulated and slower
    than float32 (measured here on an AVX2-only CPU: bfloat16 Linear ~8x slower): say so."""
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        native = torch.ops.mkldnn._is_mkldnn_fp16_supported()
    if not native:
        warnings.warn(
            f"this CPU has no native {str(dtype).replace('torch.', '')} matrix instructions "
            f"(torch reports {torch.backends.cpu.get_cpu_capability()}): the model will run "
            f"slower than in float32 here; use float32 on this machine.",
            stacklevel=3,
        )


_HALF = (torch.bfloat16, torch.float16)

#: :meth:`BertMLP.forward_residual` folds the residual into the block's last product and runs
#: the GELU in place where it may (False: the plain ops, for A/B measurements and tests)
FOLD_RESIDUAL = True
#: what :meth:`BertModel.to_compute_dtype` takes
_COMPUTE_DTYPES = (torch.float32, *_HALF, torch.float64)


def residual_add(x: Tensor, a: Tensor) -> Tensor:
    """``x + a`` in the dtype of the residual stream ``x``. With :meth:`BertModel.to_compute_dtype`
    the block output ``a`` is bf16/fp16 and ``x`` float32: the add kernel widens ``a`` as it
    reads it (exact), one op where a cast then an add were two, with the same values."""
    if a.dtype == x.dtype or (x.dtype == torch.float32 and a.dtype in _HALF):
        return x + a
    return x + a.to(x.dtype)


#: the output fields in transformers' order (``BaseModelOutputWithPoolingAndCrossAttentions``)
_OUTPUT_FIELDS = ("last_hidden_state", "pooler_output", "hidden_states", "attentions")


@dataclass
class BertModelOutput:
    """``last_hidden_state (B, L, E)``, ``pooler_output (B, E)`` (None for a model without a
    pooler), ``hidden_states``: the embeddings output then each layer's output, each
    ``(B, L, E)`` (None unless asked for), ``attentions``: one ``(B, H, L, L)`` per layer (None
    for a layer not asked for), or None when no attention was asked for.

    Also usable like a transformers ``ModelOutput``: ``out[0]``, ``out["pooler_output"]``,
    ``out.to_tuple()``, ``keys()`` / iteration over the fields that are not None, in the order
    last_hidden_state, pooler_output, hidden_states, attentions."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None
    attentions: tuple[Tensor | None, ...] | None = None
    hidden_states: tuple[Tensor, ...] | None = None  # last, so positional construction keeps

    def keys(self) -> list[str]:
        return [k for k in _OUTPUT_FIELDS if getattr(self, k) is not None]

    def values(self) -> list[object]:
        return [getattr(self, k) for k in self.keys()]

    def items(self) -> list[tuple[str, object]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def to_tuple(self) -> tuple[object, ...]:
        """The fields that are not None, in order (what ``return_dict=False`` returns)."""
        return tuple(self.values())

    def __getitem__(self, key: str | int | slice) -> object:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key: object) -> bool:
        return key in self.keys()


class BertEmbeddings(nn.Module):
    """word + position + token type embeddings, then LayerNorm and dropout; when the tables
    are narrower than the encoder (ELECTRA-small: ``embedding_size`` 128, hidden 256), a
    linear projection to the hidden size after them (``project``; None otherwise)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        e = config.embedding_size or config.hidden_size
        self.word = embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position = embedding(config.max_position_embeddings, e)
        self.token_type = embedding(config.type_vocab_size, e)
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        #: (.., e) -> (.., hidden): ELECTRA's ``embeddings_project``
        self.project = nn.Linear(e, config.hidden_size) if e != config.hidden_size else None

    def forward(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
    ) -> Tensor:
        """``(B, L)`` ids -> ``(B, L, E)``; or packed ``(T,)`` ids with their ``position_ids``.
        ``inputs_embeds`` (``(B, L, e)`` or packed ``(T, e)``, ``e`` the tables' width)
        replaces the word lookup. ``token_type_ids`` None: every token is segment 0;
        ``position_ids`` None: ``0..L-1``."""
        out = self._embed(input_ids, token_type_ids, position_ids, inputs_embeds)
        return out if self.project is None else self.project(out)

    def _embed(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        """The tables' sum, LayerNorm and dropout: ``(B, L, e)`` or packed ``(T, e)``."""
        word = _fast.submodule(self, "word")
        position = _fast.submodule(self, "position")
        token_type = _fast.submodule(self, "token_type")
        if self._lean():
            # the same rows as the lookups below, read as views: positions 0..L-1 are the
            # first L rows, segment 0 is row 0 (bitwise the same sums, two ops fewer)
            if inputs_embeds is None:
                words = F.embedding(input_ids, word._parameters["weight"], word.padding_idx)
            else:
                words = inputs_embeds.to(word._parameters["weight"].dtype)
            length = words.shape[-2]
            if position_ids is None:
                pos = position._parameters["weight"][:length]  # (L, E)
            else:
                pos = F.embedding(position_ids, position._parameters["weight"])
            types = token_type._parameters["weight"]
            types = types[0] if token_type_ids is None else F.embedding(token_type_ids, types)
            norm = _fast.submodule(self, "norm")
            return _fast.layer_norm(norm, words + pos + types, checked=True)
        if token_type_ids is None:
            shape = (input_ids if inputs_embeds is None else inputs_embeds[..., 0]).shape
            token_type_ids = torch.zeros(shape, dtype=torch.long, device=word.weight.device)
        if position_ids is None:
            position_ids = torch.arange(token_type_ids.shape[-1], device=token_type_ids.device)
        if inputs_embeds is None:
            words = word(input_ids)
        else:
            words = inputs_embeds.to(word.weight.dtype)
        x = words + position(position_ids) + token_type(token_type_ids)
        return self.dropout(self.norm(x))  # (B, L, E) or (T, E)

    def _lean(self) -> bool:
        """Whether :meth:`forward` may read the tables and run the LayerNorm itself: this module
        and every one in it the stock class, in eval mode, without hooks, and no tracing,
        compiling or global hook around (the dropout is then the identity)."""
        mods = self._modules
        try:
            word, position, token_type = mods["word"], mods["position"], mods["token_type"]
            return (
                _fast.all_stock(
                    (
                        (self, BertEmbeddings),
                        (word, nn.Embedding),
                        (position, nn.Embedding),
                        (token_type, nn.Embedding),
                        (mods["norm"], nn.LayerNorm),
                        (mods["dropout"], nn.Dropout),
                    )
                )
                and _plain_embedding(word)  # type: ignore[arg-type]
                and _plain_embedding(position)  # type: ignore[arg-type]
                and _plain_embedding(token_type)  # type: ignore[arg-type]
                and _fast.plain_context()
            )
        except KeyError:  # a module deleted or renamed: the ordinary path says what is wrong
            return False


def _plain_embedding(mod: nn.Embedding) -> bool:
    """A lookup that is only a lookup: no max_norm renormalization, not sparse."""
    return mod.max_norm is None and not mod.sparse and not mod.scale_grad_by_freq


class BertMLP(nn.Module):
    """The feed-forward block: E -> I -> E."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, lean: bool = False) -> Tensor:
        """``(..., E)`` -> ``(..., E)``. ``lean``: the caller found this block and its modules
        stock, in eval mode, without hooks (:meth:`BertLayer.lean`)."""
        fc_in = _fast.submodule(self, "fc_in")
        cd = _fast.param(fc_in, "weight").dtype  # type: ignore[union-attr]
        x = x if x.dtype == cd else x.to(cd)
        h = None
        # bias + GELU inside the product (encoder/fused.py) where fc_in's own output is not seen
        if self.act is F.gelu and (lean or (type(fc_in) is nn.Linear and _fast.plain_call(fc_in))):
            params = fc_in._parameters
            h = _fused.linear_gelu(x, params["weight"], params["bias"])  # type: ignore[arg-type]
        if h is None:
            h = self.act(_fast.linear(fc_in, x, checked=lean))  # (..., I)
        out = _fast.linear(_fast.submodule(self, "fc_out"), h, checked=lean)  # (..., E)
        return out if lean else _fast.dropout(_fast.submodule(self, "dropout"), out)

    def stock(self) -> bool:
        """This block and its modules are the stock classes, in eval mode, without hooks, and
        no global hook, tracing or compiling is around: a call runs :meth:`forward` and its
        dropout is the identity (what :meth:`forward_residual` needs)."""
        try:
            mm = self._modules
            stock = _fast.all_stock(
                (
                    (self, BertMLP),
                    (mm["fc_in"], nn.Linear),
                    (mm["fc_out"], nn.Linear),
                    (mm["dropout"], nn.Dropout),
                )
            )
        except KeyError:  # a module deleted or renamed: the ordinary path says what is wrong
            return False
        return stock and _fast.plain_context()

    def forward_residual(self, x: Tensor) -> Tensor:
        """``x + forward(x, lean=True)``, the sum the layer's LayerNorm reads, for a block the
        layer found stock (:meth:`BertLayer.lean`): ``(..., E)`` -> ``(..., E)``.

        In inference on the CPU, where MKL computes the products (not oneDNN, which fuses the
        bias and GELU itself: :mod:`bertattn.encoder.fused`), two passes over the activations go:
        the exact GELU runs in place on the first product's output (a fresh tensor nobody else
        sees; the same values), and the residual is folded into the second product, which
        accumulates onto ``x + bias`` (``addmm_``) instead of writing a tensor that is then
        added to ``x``: the same sum in another order, within float32 rounding. Measured on
        MiniLM's widths at 1,024 rows (2-core AMD EPYC, AVX2, 1 thread): the block at 0.80x
        its time (docs/performance.md). Anywhere else: ``residual_add(x, forward(x, True))``.
        The caller has checked :meth:`stock` (or :meth:`BertLayer.lean`)."""
        fc_in = _fast.submodule(self, "fc_in")
        fc_out = _fast.submodule(self, "fc_out")
        w_in, b_in = fc_in._parameters["weight"], fc_in._parameters["bias"]
        w_out, b_out = fc_out._parameters["weight"], fc_out._parameters["bias"]
        if (
            not FOLD_RESIDUAL
            or torch.is_grad_enabled()
            or x.device.type != "cpu"
            or torch.is_autocast_enabled("cpu")  # the products' dtype is autocast's there
            or x.dtype not in (torch.float32, torch.float64)
            or w_in.dtype != x.dtype  # type: ignore[union-attr]
            or w_out.dtype != x.dtype  # type: ignore[union-attr]
            or b_out is None
            or x.numel() == 0
            or not x.is_contiguous()
        ):
            return residual_add(x, self.forward(x, True))
        h = None
        if self.act is F.gelu:  # bias + GELU inside oneDNN's product where it computes them
            h = _fused.linear_gelu(x, w_in, b_in)  # type: ignore[arg-type]
        if h is None:
            h = _fast.linear(fc_in, x, checked=True)  # (..., I)
            h = torch.ops.aten.gelu_(h) if self.act is F.gelu else self.act(h)
        e, i = x.shape[-1], h.shape[-1]
        if h.dtype != x.dtype or _prepack.uses_pack(h, w_out) or _gemm.uses_onednn(h, w_out, b_out):  # type: ignore[arg-type]
            return residual_add(x, _fast.linear(fc_out, h, checked=True))
        out = x + b_out  # (..., E), fresh and contiguous: the product accumulates onto it
        out.view(-1, e).addmm_(h.reshape(-1, i), w_out.t())  # type: ignore[union-attr]
        return out


class BertLayer(nn.Module):
    """One post-LayerNorm transformer block, as in the original BERT."""

    def __init__(self, config: BertConfig, backend: str = "auto") -> None:
        super().__init__()
        e = config.hidden_size
        self.attn = MultiHeadAttention(
            e, config.num_attention_heads, config.attention_probs_dropout_prob, backend=backend
        )
        self.attn_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attn_norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.mlp = BertMLP(config)
        self.mlp_norm = nn.LayerNorm(e, eps=config.layer_norm_eps)

    def forward(
        self, x: Tensor, mask: PreparedMask, need_weights: bool = False, lean: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """``(B, L, E)`` -> ``(B, L, E)`` and the weights when asked for. ``lean``: the
        encoder found every layer :meth:`lean` (no module call between the tensor ops)."""
        attn = _fast.submodule(self, "attn")
        # compute dtype; x (the residual) may be wider
        cd = _fast.param(_fast.submodule(attn, "out_linear"), "weight").dtype  # type: ignore[union-attr]
        a, weights = attn.attend(  # type: ignore[operator]
            x if x.dtype == cd else x.to(cd), mask, need_weights=need_weights
        )  # (B, L, E)
        return self.block(x, a, lean), weights  # weights: (B, H, L, L) | None

    def forward_packed(
        self,
        x: Tensor,
        packed: PackedBatch,
        reason: str,
        lean: bool = False,
        bias: tuple[Tensor | None, ...] | None = None,
    ) -> Tensor:
        """The same layer on packed real tokens: ``(T, E)`` -> ``(T, E)``. ``lean``: the
        encoder found every layer :meth:`lean`. ``bias``: MPNet's relative position bias, one
        ``(1, H, l, l)`` block per sequence (None: no bias)."""
        requested = self.attn.backend
        cd = self.attn.out_linear.weight.dtype
        # the packed backend asked for (a registered one too); auto packs with varlen
        explicit = requested != "auto" and get_backend(requested).layout == "packed"
        backend = requested if explicit else "varlen"
        a = self.attn.attend_packed(
            x.to(cd), packed, backend=backend, reason=reason, requested=requested, bias=bias
        )
        return self.block(x, a, lean)

    # ------------------------------------------------------------------ the lean path
    def lean(self) -> bool:
        """Whether :meth:`forward` may run ``lean`` (the tensor ops without the module calls
        between them): this layer and every module in it are the stock classes (no subclass),
        in eval mode, with no hooks.
        (The encoder checks the rest once per forward: no global hooks, tracing, compiling or
        steps recording, no weights asked for.)"""
        try:
            mods = self._modules
            attn, mlp = mods["attn"], mods["mlp"]
            am, mm = attn._modules, mlp._modules  # type: ignore[union-attr]
            dropouts = (am["dropout"], mods["attn_dropout"], mm["dropout"])
            return _fast.all_stock(
                (
                    (self, BertLayer),
                    (attn, MultiHeadAttention),
                    (mlp, BertMLP),
                    (am["q_linear"], nn.Linear),
                    (am["k_linear"], nn.Linear),
                    (am["v_linear"], nn.Linear),
                    (am["out_linear"], nn.Linear),
                    (mm["fc_in"], nn.Linear),
                    (mm["fc_out"], nn.Linear),
                    (mods["attn_norm"], nn.LayerNorm),
                    (mods["mlp_norm"], nn.LayerNorm),
                    *((d, nn.Dropout) for d in dropouts),
                )
            ) and all(0.0 <= d.p <= 1.0 for d in dropouts)  # type: ignore[operator]
        except KeyError:  # a module deleted or renamed: the ordinary path says what is wrong
            return False

    def block(self, x: Tensor, a: Tensor, lean: bool = False) -> Tensor:
        """Residual + LayerNorm around the attention output ``a``, then the MLP block.
        ``lean``: every module here is stock, in eval mode, without hooks (:meth:`lean`), so
        the dropouts are the identity and no module needs calling."""
        if not lean:
            a = _fast.dropout(_fast.submodule(self, "attn_dropout"), a)
        norm = _fast.submodule(self, "attn_norm")
        x = _fast.layer_norm(norm, residual_add(x, a), checked=lean)  # (..., E)
        mlp = _fast.submodule(self, "mlp")
        norm = _fast.submodule(self, "mlp_norm")
        if lean or (type(mlp) is BertMLP and mlp.stock()):  # the residual folded in, where it pays
            summed = mlp.forward_residual(x)  # type: ignore[operator]
            return _fast.layer_norm(norm, summed, checked=True)  # (..., E)
        if type(mlp) is BertMLP and _fast.plain_call(mlp):
            m = mlp.forward(x, lean)  # type: ignore[operator]
        else:
            m = mlp(x)
        return _fast.layer_norm(norm, residual_add(x, m), checked=lean)  # (..., E)


class BertEncoder(nn.Module):
    """The stack of layers. One entry point, so a padding-free (varlen) path can replace the
    loop without touching the layers: ``forward(hidden, mask, output_attentions)``."""

    def __init__(self, config: BertConfig, backend: str = "auto") -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            BertLayer(config, backend) for _ in range(config.num_hidden_layers)
        )
        if config.relative_attention_num_buckets:  # MPNet: (buckets, H), shared by every layer
            self.relative_attention_bias = embedding(
                config.relative_attention_num_buckets, config.num_attention_heads
            )

    def relative_table(self) -> Tensor | None:
        """MPNet's relative position bias table ``(buckets, H)``; None for BERT (no such bias)."""
        table = self._modules.get("relative_attention_bias")
        return None if table is None else _fast.param(table, "weight")

    def position_bias(self, length: int, dtype: torch.dtype) -> Tensor | None:
        """MPNet's relative position bias for a padded batch of ``length`` tokens,
        ``(1, H, L, L)`` in ``dtype`` (computed once per forward, added to every layer's
        scaled scores: :mod:`bertattn.blocks.relative`); None for BERT."""
        table = self.relative_table()
        return None if table is None else _relative.position_bias(table, length, dtype)

    def forward(
        self,
        hidden: Tensor,
        mask: PreparedMask,
        output_attentions: frozenset[int] = frozenset(),
        collect: list[Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor | None, ...]]:
        """``collect``: when a list, each layer's output is appended to it."""
        lean = not output_attentions and self.lean()
        attentions: list[Tensor | None] = []
        for i, layer in enumerate(self.layers):
            if lean:  # no hook to run: the layer's forward itself
                hidden, weights = layer.forward(hidden, mask, False, True)
            else:
                hidden, weights = layer(hidden, mask, need_weights=i in output_attentions)
            attentions.append(weights)
            if collect is not None:
                collect.append(hidden)
        return hidden, tuple(attentions)  # (B, L, E), per layer (B, H, L, L) | None

    def lean(self) -> bool:
        """Whether every layer may run ``lean`` (checked once per forward): every layer
        :meth:`BertLayer.lean`, and no global hook, tracing, compiling or steps recording
        (:func:`bertattn.attention.record_steps`) around."""
        layers = self._modules.get("layers")
        return (
            type(layers) is nn.ModuleList
            and not _steps._open_blocks
            and _fast.plain_context()
            and all(type(la) is BertLayer and la.lean() for la in layers._modules.values())  # type: ignore[union-attr]
        )

    def forward_packed(
        self,
        hidden: Tensor,
        packed: PackedBatch,
        reason: str,
        collect: list[Tensor] | None = None,
    ) -> Tensor:
        """Every layer on packed real tokens ``(T, E)``; no attention weights. ``collect``:
        when a list, each layer's (packed) output is appended to it. MPNet's relative position
        bias is computed here once, one block per sequence, and given to every layer."""
        lean = self.lean()
        table = self.relative_table()
        bias = None
        if table is not None:  # the compute dtype: what the per-sequence kernel adds it to
            cd = self.layers[0].attn.out_linear.weight.dtype if len(self.layers) else table.dtype
            bias = _relative.packed_position_bias(table, packed, cd)
        for layer in self.layers:
            hidden = layer.forward_packed(hidden, packed, reason, lean, bias)
            if collect is not None:
                collect.append(hidden)
        return hidden  # (T, E)


class BertPooler(nn.Module):
    """dense + tanh on the first ([CLS]) token."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        dense = _fast.submodule(self, "dense")
        first = hidden.select(1, 0)  # (B, E): the [CLS] token
        cd = _fast.param(dense, "weight").dtype  # type: ignore[union-attr]
        pooled = torch.tanh(_fast.linear(dense, first if first.dtype == cd else first.to(cd)))
        return pooled if pooled.dtype == hidden.dtype else pooled.to(hidden.dtype)  # (B, E)


class BertModel(nn.Module):
    """A BERT encoder whose self-attention is :class:`bertattn.MultiHeadAttention`.

    Args:
        config: the hyper-parameters.
        backend: attention backend for every layer (``"auto"``, ``"math"``, ``"sdpa"``, ...).
        add_pooling_layer: False for checkpoints without a pooler (e.g. ``BertForMaskedLM``).
    """

    def __init__(
        self, config: BertConfig, *, backend: str = "auto", add_pooling_layer: bool = True
    ) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise ArgumentTypeError(f"config must be a BertConfig, got {type(config).__name__}.")
        check_str(backend, "backend")
        check_bool(add_pooling_layer, "add_pooling_layer")
        if backend != "auto":
            get_backend(backend)  # raises with the valid names
        self.config = config
        self.backend = backend
        from ..families import registry

        # the family record builds the three parts (BERT's own for BERT's family)
        family = registry.get(config.family)
        self.embeddings, self.encoder, self.pooler = family.build(
            config, backend, add_pooling_layer
        )
        self.name_or_path = ""

    @property
    def device(self) -> torch.device:
        """Where the weights are (that of the word embeddings)."""
        word = _fast.submodule(_fast.submodule(self, "embeddings"), "word")
        return _fast.param(word, "weight").device  # type: ignore[union-attr]

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: that of the matrix products (see :meth:`to_compute_dtype`)."""
        layers = _fast.submodule(_fast.submodule(self, "encoder"), "layers")._modules
        if layers:
            attn = _fast.submodule(next(iter(layers.values())), "attn")  # type: ignore[arg-type]
            return _fast.param(_fast.submodule(attn, "out_linear"), "weight").dtype  # type: ignore[union-attr]
        word = _fast.submodule(_fast.submodule(self, "embeddings"), "word")
        return _fast.param(word, "weight").dtype  # type: ignore[union-attr]

    def to_compute_dtype(self, dtype: torch.dtype) -> BertModel:
        """Run the matrix products in ``dtype`` (e.g. bfloat16) and keep the embeddings, every
        LayerNorm and the residual stream in float32, as mixed precision does: the GEMMs get
        the half-precision speed, the sums and normalizations keep float32 accuracy. The
        outputs are float32. (``model.to(torch.bfloat16)`` makes everything bfloat16 instead.)
        ``dtype``: float32, float16, bfloat16 or float64 (a torch.dtype or its name).
        """
        dtype = check_dtype(dtype, "dtype", _COMPUTE_DTYPES)  # type: ignore[assignment]
        if dtype is None:
            raise ArgumentTypeError("dtype must be a floating-point torch.dtype, got None.")
        _warn_if_slow_half(dtype, self.device)
        for layer in self.encoder.layers:
            layer.attn.to(dtype)  # repacks the fused QKV storage
            layer.mlp.to(dtype)
        if self.pooler is not None:
            self.pooler.to(dtype)
        return self

    def prepack(self, token_counts: Iterable[int]) -> BertModel:
        """Pack every GEMM weight once for MKL, for inputs of exactly these token counts: a
        latency option for float32 CPU inference at small, known shapes (one short query).

        A token count is the rows each linear layer sees: batch x sequence length for a padded
        batch, the real tokens for a packed one (``[9]`` for one 9-token query). Calls at those
        counts, without autograd, skip MKL's per-call re-layout of the weights; other counts
        run as before. Each count keeps one more copy of the weights (logged at INFO); an empty
        ``token_counts`` drops the packs. Outputs match the unpacked model to float32 rounding.
        Returns the model. See :mod:`bertattn.attention.prepack`.
        """
        _prepack.prepack(self, token_counts)
        return self

    def _layers_for_weights(self, output_attentions: bool | Sequence[int]) -> frozenset[int]:
        """``output_attentions`` (a bool or layer indices) as a set of layer indices."""
        n = self.config.num_hidden_layers
        if isinstance(output_attentions, (bool, np.bool_)):
            chosen = frozenset(range(n)) if output_attentions else frozenset()
        elif isinstance(output_attentions, Sequence) and not isinstance(output_attentions, str):
            chosen = frozenset()
            for i in output_attentions:
                if not is_int(i):
                    raise ArgumentTypeError(
                        f"output_attentions: layer index {describe(i)} is not an int; give "
                        f"layer indices 0..{n - 1} (or -{n}..-1)."
                    )
                if not -n <= i < n:
                    raise ValueError(
                        f"output_attentions: layer index {i!r} is out of range; this model has "
                        f"{n} layers, valid indices are 0..{n - 1} (or -{n}..-1)."
                    )
                chosen |= {int(i) % n}
        else:
            raise ArgumentTypeError(
                f"output_attentions must be a bool or a sequence of layer indices, got "
                f"{type(output_attentions).__name__}."
            )
        if chosen and self.backend != "auto" and not get_backend(self.backend).returns_weights:
            raise ValueError(
                f"attention weights were asked for, but this model runs backend "
                f"{self.backend!r}, which does not return them; build it with backend='auto' "
                f"(math for the asked layers only) or backend='math'."
            )
        return chosen

    def _packing(
        self,
        attention_mask: Tensor | None,
        want: frozenset[int],
        shape: tuple[int, int],
    ) -> tuple[PackedBatch | None, str]:
        """Whether this forward runs packed (varlen), and why; decided once per forward.

        Explicit ``varlen`` always packs; ``auto`` packs a padded batch when no weights are
        asked for and the padding share reaches the ``auto`` threshold; torch.compile / export
        tracing never packs (the per-sequence loop depends on tensor values).
        """
        explicit = self.backend != "auto" and get_backend(self.backend).layout == "packed"
        if not explicit and (self.backend != "auto" or want or attention_mask is None):
            return None, ""
        device = self.device
        if not explicit and device.type != "cpu":  # auto packs on CPU only (dispatch.py)
            return None, ""
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or is_capturing(device):
            if explicit:
                raise ValueError(
                    "backend 'varlen' cannot be traced or captured (torch.compile, export, a "
                    "CUDA graph): its packing depends on the mask's values; use 'sdpa' or "
                    "'auto'."
                )
            return None, ""
        if attention_mask is None:  # explicit varlen, no padding: one sequence per row
            attention_mask = torch.ones(shape, dtype=torch.bool, device=device)
        if explicit:
            packed = pack_padding_mask(attention_mask)
            pad_fraction = packed.pad_fraction
        else:  # decide from one count first: packing costs a few ops, and often does not pay
            packed = None
            size = shape[0] * shape[1]
            real = int(torch.count_nonzero(attention_mask))
            pad_fraction = 0.0 if size == 0 else 1.0 - real / size
        name, reason = choose_backend(
            self.backend,
            need_weights=False,
            pad_fraction=pad_fraction,
            device_type=device.type,
            dtype=self.dtype,
            key_len=shape[1],
        )
        if get_backend(name).layout != "packed":
            return None, ""
        return (packed or pack_padding_mask(attention_mask)), reason

    def _check_id_values(
        self, input_ids: Tensor | None, token_type_ids: Tensor | None, position_ids: Tensor | None
    ) -> None:
        """Every id within its embedding table (one min/max per tensor, on the CPU only and not
        while tracing or capturing: see :func:`bertattn.arguments.values_checkable`)."""
        cfg = self.config
        for name, t, count, field in (
            ("input_ids", input_ids, cfg.vocab_size, "vocab_size"),
            ("token_type_ids", token_type_ids, cfg.type_vocab_size, "type_vocab_size"),
            ("position_ids", position_ids, cfg.max_position_embeddings, "max_position_embeddings"),
        ):
            if t is not None:
                check_id_range(t, name, count, f"config.{field}={count}")

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | Sequence[int] | None = False,
        output_hidden_states: bool | None = False,
        return_dict: bool | None = True,
        *,
        head_mask: Tensor | None = None,
        **unsupported: object,
    ) -> BertModelOutput | tuple[Tensor | tuple[Tensor | None, ...], ...]:
        """Encode a batch; the keywords of ``transformers.BertModel.forward``.

        Args:
            input_ids: ``(B, L)`` token ids (or give ``inputs_embeds``).
            attention_mask: ``(B, L)``, 1 = real token, 0 = padding (Hugging Face polarity).
            token_type_ids: ``(B, L)`` segment ids; zeros when None.
            position_ids: ``(B, L)`` or ``(1, L)`` positions; ``0..L-1`` when None.
            inputs_embeds: ``(B, L, E)`` word embeddings used instead of looking up
                ``input_ids``; position and token type embeddings and the LayerNorm still apply.
                (The positional order is transformers 5's.)
            output_attentions: True for every layer's weights, or the layer indices wanted
                (only those run the weight-returning math path).
            output_hidden_states: also return ``hidden_states``: the embeddings output and each
                layer's output, ``num_hidden_layers + 1`` tensors ``(B, L, E)`` (zeros at the
                padding positions when the batch runs packed, like ``last_hidden_state``).
            return_dict: False returns ``output.to_tuple()``, as transformers does.
            head_mask: transformers 4's; not supported (must be None).

        Arguments are checked first: ``TypeError`` for a wrong type (ids that are not an
        integer tensor, a mask that is not a tensor), ``ValueError`` for a shape, sequences of
        no token, or, on the CPU, an id outside its table (``vocab_size``, ``type_vocab_size``,
        ``max_position_embeddings``; one min/max per ids tensor). On CUDA and while tracing,
        compiling or capturing a CUDA graph the ids' values are not read back (that would
        wait for the device, or break the capture): a bad id fails in the embedding kernel.
        """
        if unsupported:
            names = ", ".join(sorted(unsupported))
            raise TypeError(
                f"BertModel.forward() got unsupported keyword argument(s): {names}. bertattn's "
                f"BertModel is an encoder only (no cross-attention, cache or task heads)."
            )
        if head_mask is not None:
            raise NotImplementedError(
                "head_mask is not supported by bertattn's BertModel (its attention backends do "
                "not scale individual heads); pass head_mask=None."
            )
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds.")
        check_tensor(input_ids, "input_ids", optional=True, integer=True)
        check_tensor(inputs_embeds, "inputs_embeds", optional=True)
        check_tensor(attention_mask, "attention_mask", optional=True)
        check_tensor(token_type_ids, "token_type_ids", optional=True, integer=True)
        check_tensor(position_ids, "position_ids", optional=True, integer=True)
        check_bool(output_hidden_states, "output_hidden_states", optional=True)
        check_bool(return_dict, "return_dict", optional=True)
        if inputs_embeds is not None:
            e = self.config.hidden_size
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != e:
                raise ValueError(
                    f"inputs_embeds must be a (batch, seq_len, {e}) tensor, got "
                    f"{tuple(inputs_embeds.shape)}."
                )
            b, seq_len = inputs_embeds.shape[:2]
            device = inputs_embeds.device
        else:
            if input_ids.dim() != 2:  # type: ignore[union-attr]
                got = tuple(input_ids.shape)  # type: ignore[union-attr]
                raise ValueError(f"input_ids must be a (batch, seq_len) tensor, got {got}.")
            b, seq_len = input_ids.shape  # type: ignore[union-attr]
            device = input_ids.device  # type: ignore[union-attr]
        if seq_len == 0:  # (a batch of no sequences, (0, L), runs: it gives (0, L, E))
            name = "input_ids" if inputs_embeds is None else "inputs_embeds"
            got = (input_ids if inputs_embeds is None else inputs_embeds).shape  # type: ignore[union-attr]
            raise ValueError(
                f"{name} has shape {tuple(got)}: sequences of no token; give at least one token "
                f"per sequence (a tokenized text holds [CLS] and [SEP])."
            )
        if position_ids is None and seq_len > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings}); truncate the input."
            )
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and tuple(t.shape) != (b, seq_len):
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}; expected {(b, seq_len)} like input_ids."
                )
        if position_ids is not None:
            if (
                position_ids.dim() != 2
                or position_ids.shape[0] not in (1, b)
                or (position_ids.shape[1] != seq_len)
            ):
                raise ValueError(
                    f"position_ids has shape {tuple(position_ids.shape)}; expected "
                    f"{(b, seq_len)} or {(1, seq_len)}."
                )
            position_ids = position_ids.expand(b, seq_len)
        self._check_id_values(input_ids, token_type_ids, position_ids)
        tracing = torch.compiler.is_compiling()  # a graph records no per-call choice
        if not tracing and _dispatch.explaining() and device.type == "cpu" and (
            self.dtype is torch.float32
        ):
            _gemm.choice()  # decided now if no product has run yet
            _dispatch.note(_gemm.describe(), once=True)
        want = self._layers_for_weights(False if output_attentions is None else output_attentions)
        rows = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        chunks, workers, order = self._chunks(attention_mask, b, seq_len, device)
        if order is not None:  # the rows regrouped into even pieces; put back at the end
            rows = tuple(None if t is None else t.index_select(0, order) for t in rows)
        if len(chunks) > 1:  # a large CPU batch: row chunks, concatenated (encoder/chunks.py)
            runs = [
                functools.partial(
                    self._run,
                    *(None if t is None else t[start:end] for t in rows),
                    want,
                    bool(output_hidden_states),
                    (end - start, seq_len),
                    device,
                )
                for start, end in chunks
            ]
            workers = min(workers, len(runs))  # side by side where workers > 1 (runtime/workers.py)
            each = max(torch.get_num_threads() // workers, 1)
            if _dispatch.explaining():
                each_s = f"{each} thread{'s' if each > 1 else ''} each"
                how = f"on {workers} chunk workers, {each_s}" if workers > 1 else "one by one"
                regrouped = ", regrouped by cost" if order is not None else ""
                _dispatch.note(
                    f"row chunks: {b} rows as {len(runs)} chunks of "
                    f"{'/'.join(str(e - s) for s, e in chunks)} rows{regrouped}, {how}"
                )
            out = _chunks.concat_outputs(_workers.run_all(runs, workers, each), order)
        else:
            out = self._run(*rows, want, bool(output_hidden_states), (b, seq_len), device)
        return out if return_dict or return_dict is None else out.to_tuple()  # type: ignore[return-value]

    @property
    def chunk_tokens(self) -> int | None:
        """Tokens per row chunk of a large CPU batch in inference (:mod:`bertattn.encoder.chunks`):
        None (the default) lets the model choose from its widths and compute dtype
        (:attr:`chunk_budget`); 0 never chunks."""
        return self.__dict__.get("_chunk_tokens")

    @chunk_tokens.setter
    def chunk_tokens(self, value: int | None) -> None:
        value = check_int(
            value, "chunk_tokens", low=0, optional=True, why="0 never chunks; None: the model's"
        )
        self.__dict__["_chunk_tokens"] = value

    @property
    def chunk_budget(self) -> int:
        """The tokens per chunk in effect: :attr:`chunk_tokens`, or the model's own when that
        is None (0: never chunked)."""
        budget = self.chunk_tokens
        if budget is None:
            cfg = self.config
            budget = _chunks.chunk_tokens(
                cfg.hidden_size, cfg.intermediate_size, self.dtype.itemsize
            )
        return budget

    @property
    def chunk_workers(self) -> int | None:
        """How many row chunks of a large CPU batch run side by side, each on its share of the
        intra-op threads (:mod:`bertattn.runtime.workers`): None (the default) as many as torch's
        thread count allows, 1 one after another; never more than that count."""
        return self.__dict__.get("_chunk_workers")

    @chunk_workers.setter
    def chunk_workers(self, value: int | None) -> None:
        value = check_int(
            value, "chunk_workers", low=1, optional=True, why="1: one chunk at a time"
        )
        self.__dict__["_chunk_workers"] = value

    def balances_load(self, tokens: int, threads: int | None = None) -> bool:
        """Whether a CPU inference batch of ``tokens`` real tokens balances its own load at
        ``threads`` intra-op threads (default: torch's count now): it runs as more row chunks
        than chunk workers (at least two each), so a core taken by other work slows one worker,
        which then does fewer chunks, instead of every product. The thread governor leaves such
        a batch at its full count (:mod:`bertattn.runtime.threads`); a batch cut into one piece per
        worker cannot rebalance and stays governed."""
        workers = self._workers_at(torch.get_num_threads() if threads is None else threads)
        return _chunks.more_chunks_than_workers(tokens, self.chunk_budget, workers)

    def fill_tokens(self, batch_size: int, max_length: int) -> int:
        """The padded tokens a batch of short texts may fill past ``batch_size`` texts
        (:func:`bertattn.encoder.pooling.length_batches`), 0 for none. On the CPU: two row chunks
        per chunk worker (:attr:`chunk_budget`), so that the workers share the batch's load,
        but never more tokens than ``batch_size`` texts of ``max_length`` tokens would take,
        the memory a caller's ``batch_size`` already allows. Measured on MiniLM (2-core Zen 4,
        400 short texts of 11 tokens on average, texts/s): batches of 32 texts against batches
        filled to 4,096 tokens, float32 544 against 630, bfloat16 878 against 1,025. Off the
        CPU, or with chunks off (:attr:`chunk_tokens` 0): 0."""
        if self.device.type != "cpu" or not self.chunk_budget:
            return 0
        workers = self._workers_at(torch.get_num_threads())
        return min(batch_size * max_length, 2 * workers * self.chunk_budget)

    def _workers_at(self, threads: int) -> int:
        """The chunk workers :attr:`chunk_workers` asks for at ``threads`` intra-op threads."""
        return min(self.chunk_workers or threads, threads)

    def _chunks(
        self, attention_mask: Tensor | None, b: int, seq_len: int, device: torch.device
    ) -> tuple[list[tuple[int, int]], int, Tensor | None]:
        """The row ranges this forward runs as (one range: the whole batch), how many run
        side by side, and the ``(B,)`` row order the ranges cut (None: the batch's own).
        Chunks only on the CPU, without autograd, in eval mode, outside tracing, compiling and
        capturing; within :attr:`chunk_budget` tokens each and, with more than one worker,
        split for them (:func:`bertattn.encoder.chunks.plan_chunks`), the rows regrouped when
        that evens out the pieces (:func:`bertattn.encoder.chunks.regroup_rows`)."""
        whole = [(0, b)], 1, None
        if (  # the cheap checks first: a one-query forward pays for nothing more
            b < 2
            or device.type != "cpu"
            or self.training
            or torch.is_grad_enabled()
            or torch.compiler.is_compiling()
            or torch.jit.is_tracing()
            or is_capturing(device)
        ):
            return whole
        budget = self.chunk_budget
        if not budget:
            return whole
        workers = self._worker_count()
        padded = b * seq_len  # at least the real tokens
        if padded <= budget and (workers < 2 or padded < 2 * _chunks.MIN_PIECE_TOKENS):
            return whole  # not read off the mask: a small batch pays for nothing more
        if attention_mask is None:
            lengths = [seq_len] * b
        else:
            lengths = attention_mask.sum(dim=1).tolist()  # real tokens per row
        plan = _chunks.plan_chunks(lengths, budget, workers)
        if workers < 2 or len(plan) < 2 or attention_mask is None:
            return plan, workers, None
        cfg = self.config
        costs = _chunks.row_costs(lengths, cfg.hidden_size, cfg.intermediate_size)
        regrouped = _chunks.regroup_rows(lengths, costs, plan, budget)
        if regrouped is None:
            return plan, workers, None
        order, ranges = regrouped
        return ranges, workers, torch.tensor(order, device=device)

    def _worker_count(self) -> int:
        """Chunk workers for this forward: :attr:`chunk_workers` within torch's thread count;
        one where the chunks must run in this thread (from a worker, under autocast, while the
        article's steps are recorded, whose records pair up in call order)."""
        threads = torch.get_num_threads()
        if (
            threads < 2
            or _workers.in_worker()
            or torch.is_autocast_enabled("cpu")
            or _steps.recorder() is not None
        ):
            return 1
        return self._workers_at(threads)

    def _run(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
        want: frozenset[int],
        output_hidden_states: bool,
        shape: tuple[int, int],
        device: torch.device,
    ) -> BertModelOutput:
        """The forward itself, on checked arguments: ``shape`` is ``(B, L)``."""
        b, seq_len = shape
        collect: list[Tensor] | None = [] if output_hidden_states else None

        embeddings = _fast.submodule(self, "embeddings")
        packed, reason = self._packing(attention_mask, want, (b, seq_len))
        if packed is not None:  # pack once, every layer on (T, E), pad once
            ids = None if input_ids is None else unpad(input_ids, packed)  # (T,)
            embeds = None if inputs_embeds is None else unpad(inputs_embeds, packed)  # (T, E)
            types = None if token_type_ids is None else unpad(token_type_ids, packed)  # (T,)
            if position_ids is None:
                position_ids = torch.arange(seq_len, device=device).expand(b, -1)
            positions = unpad(position_ids, packed)  # (T,)
            hidden = _fast.call(embeddings, ids, types, positions, embeds)  # (T, E)
            if collect is not None:
                collect.append(hidden)
            hidden = self.encoder.forward_packed(hidden, packed, reason, collect)
            hidden = pad(hidden, packed)  # (B, L, E)
            if collect is not None:
                collect = [pad(h, packed) for h in collect[:-1]] + [hidden]
            attentions: tuple[Tensor | None, ...] = ()
        else:
            hidden = _fast.call(
                embeddings, input_ids, token_type_ids, position_ids, inputs_embeds
            )  # (B, L, E)
            if collect is not None:
                collect.append(hidden)
            encoder = _fast.submodule(self, "encoder")
            mask = prepare_mask(  # once per forward, shared by every layer
                key_padding_mask=attention_mask,
                attn_bias=encoder.position_bias(seq_len, hidden.dtype),  # type: ignore[operator]
                batch=b,
                heads=self.config.num_attention_heads,
                query_len=seq_len,
                key_len=seq_len,
                dtype=hidden.dtype,
                device=hidden.device,
            )
            hidden, attentions = _fast.call(encoder, hidden, mask, want, collect)  # (B, L, E)
        pooler = _fast.submodule(self, "pooler")  # None for a model without one
        pooled = None if pooler is None else _fast.call(pooler, hidden)  # (B, E)
        return BertModelOutput(
            hidden,
            pooled,
            attentions if want else None,
            None if collect is None else tuple(collect),
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | ModelFolder | None,
        *,
        dtype: torch.dtype | str | None = None,
        torch_dtype: torch.dtype | str | None = None,
        backend: str = "auto",
        attn_implementation: str | None = None,
        revision: str | None = None,
        local_files_only: bool | None = None,
        **unsupported: object,
    ) -> BertModel:
        """Load a Hugging Face BERT folder, a sentence-transformers folder, a cached hub name,
        a resolved :class:`~bertattn.encoder.folder.ModelFolder`, or None (the default model);
        see :func:`bertattn.encoder.checkpoint.load_pretrained`. Takes transformers' keywords
        ``torch_dtype`` (alias of ``dtype``), ``dtype="auto"``, ``attn_implementation``
        (``"sdpa"`` / ``"eager"``), ``revision`` (only the default) and ``local_files_only``."""
        from .checkpoint import load_pretrained

        return load_pretrained(
            cls,
            path,
            dtype=dtype,
            torch_dtype=torch_dtype,
            backend=backend,
            attn_implementation=attn_implementation,
            revision=revision,
            local_files_only=local_files_only,
            **unsupported,
        )
