"""The encoder every family runs through, built on :class:`bertattn.MultiHeadAttention`: the
family's record builds its embeddings, layers and pooler (BERT's own layer classes are in
:mod:`bertattn.families.bert_layers`), and :class:`BertModel` runs them. Read top to bottom:

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

import numpy as np
import torch
from torch import Tensor, nn

from ..arguments import (
    ArgumentTypeError,
    check_bool,
    check_id_range,
    check_int,
    check_str,
    check_tensor,
    describe,
    is_int,
)
from ..attention import PreparedMask, get_backend
from ..attention import dispatch as _dispatch
from ..attention import fastcall as _fast
from ..attention import gemm as _gemm
from ..attention import prepack as _prepack
from ..attention import steps as _steps
from ..attention.dispatch import choose_backend
from ..attention.masks import self_attention_mask
from ..attention.padding import pack_padding_mask, pad, unpad
from ..blocks import contract as _contract
from ..blocks.contract import EncoderStack, Packing, missing_members
from ..capture import is_capturing
from ..dtypes import parse_dtype
from ..families.bert_layers import (
    BertEmbeddings,
    BertEncoder,
    BertLayer,
)
from ..runtime import workers as _workers
from . import chunks as _chunks
from .checkpoint import load_pretrained
from .config import BertConfig

__all__ = ["BertModel", "BertModelOutput", "BertEncoder", "BertLayer", "BertEmbeddings"]


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


def _check_stack(stack: object, family: str) -> None:
    """Refuse, by its class and the members it lacks, an encoder stack ``family`` built that
    does not keep the encoder contract (:class:`bertattn.blocks.contract.EncoderStack`)."""
    if isinstance(stack, EncoderStack):
        return
    lacks = ", ".join(missing_members(stack))
    raise ValueError(
        f"family {family!r} built a {type(stack).__name__} as its encoder stack, which does "
        f"not keep the encoder contract (it lacks {lacks}); build a stack that declares "
        f"bertattn.blocks.contract.EncoderStack (layers, info, forward, forward_packed, "
        f"position_bias)."
    )


def padded_mask(
    stack: EncoderStack, key_padding_mask: Tensor | None, hidden: Tensor, heads: int
) -> PreparedMask:
    """The mask of a padded self-attention forward of ``stack`` over ``hidden`` ``(B, L, E)``
    with ``heads`` heads: ``key_padding_mask`` ``(B, L)`` (1 = a token attended to; None:
    every token) and, for a stack with a relative position bias, that bias."""
    length = hidden.shape[1]
    bias = stack.position_bias(length, hidden.dtype) if stack.info.relative_bias else None
    return self_attention_mask(key_padding_mask, bias, heads=heads, like=hidden)


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
        _check_stack(self.encoder, family.name)
        self.name_or_path = ""
        #: the task adapter merged into the weights at load (None: the base weights), and the
        #: ones the folder has (empty for a family or folder without task adapters)
        self.task: str | None = None
        self.task_names: tuple[str, ...] = family.task_names(config.arch)

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
        dtype = parse_dtype(dtype)  # type: ignore[assignment]
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
    ) -> Packing | None:
        """Whether this forward runs packed, on which backend and why; decided once per
        forward and handed to the encoder stack (None: padded).

        Explicit ``varlen`` (or another packed backend) always packs; ``auto`` packs a padded
        batch when no weights are asked for and the padding share reaches the ``auto``
        threshold; torch.compile / export tracing never packs (the per-sequence loop depends on
        tensor values); a stack whose ``info`` has no packed path never packs.
        """
        explicit = self.backend != "auto" and _contract.packs(self.backend)
        if not explicit and (self.backend != "auto" or want or attention_mask is None):
            return None
        if not _fast.submodule(self, "encoder").info.packed:  # type: ignore[union-attr]
            if explicit:
                raise ValueError(
                    f"backend {self.backend!r} packs the real tokens, but this model's encoder "
                    f"stack ({type(self.encoder).__name__}) has no packed path (its info says "
                    f"packed=False); use 'sdpa' or 'auto'."
                )
            return None
        device = self.device
        if not explicit and device.type != "cpu":  # auto packs on CPU only (dispatch.py)
            return None
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or is_capturing(device):
            if explicit:
                raise ValueError(
                    "backend 'varlen' cannot be traced or captured (torch.compile, export, a "
                    "CUDA graph): its packing depends on the mask's values; use 'sdpa' or "
                    "'auto'."
                )
            return None
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
        if not explicit and not _contract.packs(name):  # auto chose a padded backend
            return None
        return Packing(packed or pack_padding_mask(attention_mask), name, reason)

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
        self._check_arguments(
            unsupported,
            head_mask,
            input_ids,
            inputs_embeds,
            attention_mask,
            token_type_ids,
            position_ids,
            output_hidden_states,
            return_dict,
        )
        b, seq_len, device = self._batch_shape(input_ids, inputs_embeds)
        position_ids = self._check_side_inputs(
            b, seq_len, attention_mask, token_type_ids, position_ids
        )
        self._check_id_values(input_ids, token_type_ids, position_ids)
        tracing = torch.compiler.is_compiling()  # a graph records no per-call choice
        if (
            not tracing
            and _dispatch.explaining()
            and device.type == "cpu"
            and (self.dtype is torch.float32)
        ):
            _gemm.choice()  # decided now if no product has run yet
            _dispatch.note(_gemm.describe(), once=True)
        want = self._layers_for_weights(False if output_attentions is None else output_attentions)
        rows = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        chunks, workers, order = self._chunks(attention_mask, b, seq_len, device)
        if order is not None:  # the rows regrouped into even pieces; put back at the end
            rows = tuple(None if t is None else t.index_select(0, order) for t in rows)
        if len(chunks) > 1:  # a large CPU batch: row chunks, concatenated (encoder/chunks.py)
            out = self._run_chunks(
                rows, chunks, workers, order, want, bool(output_hidden_states), (b, seq_len), device
            )
        else:
            out = self._run(*rows, want, bool(output_hidden_states), (b, seq_len), device)
        return out if return_dict or return_dict is None else out.to_tuple()  # type: ignore[return-value]

    @staticmethod
    def _check_arguments(
        unsupported: dict[str, object],
        head_mask: object,
        input_ids: object,
        inputs_embeds: object,
        attention_mask: object,
        token_type_ids: object,
        position_ids: object,
        output_hidden_states: object,
        return_dict: object,
    ) -> None:
        """:meth:`forward`'s arguments of the right kinds (``TypeError``), exactly one of
        ``input_ids`` and ``inputs_embeds``, no ``head_mask``."""
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

    def _batch_shape(
        self, input_ids: Tensor | None, inputs_embeds: Tensor | None
    ) -> tuple[int, int, torch.device]:
        """``(B, L)`` and the device of the ids ``(B, L)`` or the embeddings ``(B, L, E)``;
        ``ValueError`` for another shape or sequences of no token."""
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
        return b, seq_len, device

    def _check_side_inputs(
        self,
        b: int,
        seq_len: int,
        attention_mask: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
    ) -> Tensor | None:
        """The mask and segment ids of shape ``(B, L)``, the positions ``(B, L)`` or ``(1, L)``
        (returned expanded to ``(B, L)``; None when not given), and a length within the
        position table when the positions are the default ones."""
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
        return position_ids

    def _run_chunks(
        self,
        rows: tuple[Tensor | None, ...],
        chunks: list[tuple[int, int]],
        workers: int,
        order: Tensor | None,
        want: frozenset[int],
        hidden: bool,
        shape: tuple[int, int],
        device: torch.device,
    ) -> BertModelOutput:
        """A large CPU batch as row ``chunks`` (``(start, end)`` each), run one by one or on
        ``workers`` side by side, concatenated and put back in the input's order."""
        runs = [
            functools.partial(
                self._run,
                *(None if t is None else t[start:end] for t in rows),
                want,
                hidden,
                (end - start, shape[1]),
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
                f"row chunks: {shape[0]} rows as {len(runs)} chunks of "
                f"{'/'.join(str(e - s) for s, e in chunks)} rows{regrouped}, {how}"
            )
        return _chunks.concat_outputs(_workers.run_all(runs, workers, each), order)

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
        packing = self._packing(attention_mask, want, (b, seq_len))
        if packing is not None:  # pack once, every layer on (T, E), pad once
            packed = packing.batch
            ids = None if input_ids is None else unpad(input_ids, packed)  # (T,)
            embeds = None if inputs_embeds is None else unpad(inputs_embeds, packed)  # (T, E)
            types = None if token_type_ids is None else unpad(token_type_ids, packed)  # (T,)
            if position_ids is None:
                position_ids = torch.arange(seq_len, device=device).expand(b, -1)
            positions = unpad(position_ids, packed)  # (T,)
            hidden = _fast.call(embeddings, ids, types, positions, embeds)  # (T, E)
            if collect is not None:
                collect.append(hidden)
            hidden = self.encoder.forward_packed(hidden, packing, collect)
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
            # once per forward, shared by every layer
            mask = padded_mask(encoder, attention_mask, hidden, self.config.num_attention_heads)
            hidden, attentions = _fast.call(encoder, hidden, mask, want, collect)  # (B, L, E)
        pooler = _fast.submodule(self, "pooler")  # None for a model without one
        pooled = None if pooler is None else _fast.call(pooler, hidden)  # (B, E)
        return BertModelOutput(
            hidden,
            pooled,
            attentions if want else None,
            None if collect is None else tuple(collect),
        )

    #: :func:`bertattn.encoder.checkpoint.load_pretrained`, as transformers names it
    from_pretrained = classmethod(load_pretrained)
