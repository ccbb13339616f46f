"""BERT's own layers, the classes its family record builds: embeddings (word + position + token
type, LayerNorm), the feed-forward block, the encoder layer (attention + residual + LayerNorm,
feed-forward + residual + LayerNorm), the stack of layers and the pooler. Read top to bottom:

    input_ids (B, L) --BertEmbeddings--> (B, L, E)
        --BertEncoder: N x BertLayer [attention, add & norm, BertMLP, add & norm]--> (B, L, E)
        --BertPooler (dense + tanh on [CLS])--> (B, E)

B batch, L sequence length, E hidden_size, I intermediate_size. The model around them (the
mask prepared once, the packing decided once per forward, dtypes, chunks) is
:class:`bertattn.encoder.model.BertModel`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import MultiHeadAttention, PreparedMask
from ..attention import fastcall as _fast
from ..attention import fused as _fused
from ..attention import gemm as _gemm
from ..attention import prepack as _prepack
from ..attention import steps as _steps
from ..blocks import activation
from ..blocks import relative as _relative
from ..blocks.contract import INT8, LEAN, LayerStack, Packing, SpeedPaths, StackInfo, offers
from ..blocks.tables import embedding


class BertConfig(Protocol):
    """The fields of a config these layers read (:class:`bertattn.BertConfig` has them all);
    written here so BERT's layers depend on the sizes, not on the folder reader."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    hidden_dropout_prob: float
    attention_probs_dropout_prob: float
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int | None
    embedding_size: int | None
    relative_attention_num_buckets: int

__all__ = [
    "HALF_DTYPES",
    "FOLD_RESIDUAL",
    "BertEmbeddings",
    "BertMLP",
    "BertLayer",
    "BertEncoder",
    "BertPooler",
    "residual_add",
]

#: the half-precision compute dtypes (the residual stream stays float32 around them)
HALF_DTYPES = (torch.bfloat16, torch.float16)

#: :meth:`BertMLP.forward_residual` folds the residual into the block's last product and runs
#: the GELU in place where it may (False: the plain ops, for A/B measurements and tests)
FOLD_RESIDUAL = True


def residual_add(x: Tensor, a: Tensor) -> Tensor:
    """``x + a`` in the dtype of the residual stream ``x``. With
    :meth:`~bertattn.encoder.model.BertModel.to_compute_dtype` the block output ``a`` is
    bf16/fp16 and ``x`` float32: the add kernel widens ``a`` as it reads it (exact), one op
    where a cast then an add were two, with the same values."""
    if a.dtype == x.dtype or (x.dtype == torch.float32 and a.dtype in HALF_DTYPES):
        return x + a
    return x + a.to(x.dtype)


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


class BertLayer(nn.Module, SpeedPaths):
    """One post-LayerNorm transformer block, as in the original BERT. It offers the lean path
    and int8 (:class:`~bertattn.blocks.contract.SpeedPaths`); a subclass offers neither unless
    it declares them."""

    speed_paths = frozenset({LEAN, INT8})

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
        packing: Packing,
        lean: bool = False,
        bias: tuple[Tensor | None, ...] | None = None,
    ) -> Tensor:
        """The same layer on packed real tokens: ``(T, E)`` -> ``(T, E)``, on the packed
        backend the model chose (``packing.backend``). ``lean``: the encoder found every layer
        :meth:`lean`. ``bias``: MPNet's relative position bias, one ``(1, H, l, l)`` block per
        sequence (None: no bias)."""
        attn = self.attn
        cd = attn.out_linear.weight.dtype
        a = attn.attend_packed(
            x.to(cd),
            packing.batch,
            backend=packing.backend,
            reason=packing.reason,
            requested=attn.backend,
            bias=bias,
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


class BertEncoder(LayerStack):
    """The stack of BERT's layers, on the encoder contract (:class:`~bertattn.blocks.contract.
    EncoderStack`): padded ``forward(hidden, mask, output_attentions, collect)``, packed
    :meth:`forward_packed`, and :attr:`info` (packed: yes; relative bias: MPNet's; lean: yes)."""

    def __init__(self, config: BertConfig, backend: str = "auto") -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            BertLayer(config, backend) for _ in range(config.num_hidden_layers)
        )
        if config.relative_attention_num_buckets:  # MPNet: (buckets, H), shared by every layer
            self.relative_attention_bias = embedding(
                config.relative_attention_num_buckets, config.num_attention_heads
            )

    @property
    def info(self) -> StackInfo:
        """What this stack can do: packed and lean always, a relative bias where it has the
        table (MPNet)."""
        has_table = self._modules.get("relative_attention_bias") is not None
        return StackInfo(packed=True, relative_bias=has_table, lean=True)

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

    def padded_state(
        self, hidden: Tensor, mask: PreparedMask, output_attentions: frozenset[int]
    ) -> bool:
        """Whether the layers run ``lean`` (no weights asked, :meth:`lean`)."""
        return not output_attentions and self.lean()

    def padded_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, mask: PreparedMask, want: bool, state: Any
    ) -> tuple[Tensor, Tensor | None]:
        """Layer ``i`` as it is called, or its forward itself when lean (no hook to run)."""
        if state:
            return layer.forward(hidden, mask, False, True)
        return layer(hidden, mask, need_weights=want)

    def lean(self) -> bool:
        """Whether every layer may run ``lean`` (checked once per forward): every layer offers
        the lean path (:func:`~bertattn.blocks.contract.offers`) and finds itself
        :meth:`BertLayer.lean`, and no global hook, tracing, compiling or steps recording
        (:func:`bertattn.attention.record_steps`) around."""
        layers = self._modules.get("layers")
        return (
            type(layers) is nn.ModuleList
            and not _steps._open_blocks
            and _fast.plain_context()
            and all(offers(la, LEAN) and la.lean() for la in layers._modules.values())  # type: ignore[union-attr]
        )

    def packed_state(self, hidden: Tensor, packing: Packing) -> tuple[bool, Tensor | None]:
        """Whether the layers run ``lean``, and MPNet's relative position bias computed once,
        one block per sequence, in the compute dtype (what the per-sequence kernel adds it
        to); None for BERT."""
        table = self.relative_table()
        bias = None
        if table is not None:
            cd = self.compute_dtype(table.dtype)
            bias = _relative.packed_position_bias(table, packing.batch, cd)
        return self.lean(), bias

    def packed_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, packing: Packing, state: Any
    ) -> Tensor:
        """Layer ``i`` on the packed real tokens ``(T, E)``, on ``packing.backend``."""
        lean, bias = state
        return layer.forward_packed(hidden, packing, lean, bias)


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
