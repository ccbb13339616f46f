"""Export :class:`BertModel` and :class:`MultiHeadAttention` to ONNX, for ONNX Runtime.

The graph comes from ``torch.onnx.export(..., dynamo=True)`` (``torch.export`` underneath) with
dynamic batch and sequence axes; the padding mask is an input, so one file serves every padded
batch, all-padding rows included (they give zeros, never NaN: see ``attention/masks.py``).

Backend choice: ``math`` by default. Both ``math`` and ``sdpa`` export and match PyTorch to
~1e-6, but the exporter decomposes ``scaled_dot_product_attention`` into more nodes (scales on
q and k, extra Slice/Reshape), and ONNX Runtime runs that graph about 2x slower on CPU
(MiniLM, 32 x 40 tokens: 259 ms vs 636 ms, 2 threads). ``varlen`` cannot be exported: it packs
the batch with offsets read from the mask as Python ints and loops over sequences, so its graph
depends on the data; an ONNX graph must not.

ONNX Runtime's BERT optimizer (``onnxruntime.transformers.optimizer.optimize_model(path,
model_type="bert", ...)``) fuses every residual Add + LayerNorm into ``SkipLayerNormalization``
(2 per layer, plus the embedding sum) and MatMul + bias + Gelu into ``BiasGelu``, but not the
attention: its ``Attention`` patterns match the TorchScript exporter's graph (three Q/K/V
MatMul + Add chains, a ``(1 - mask) * -10000`` mask), not the dynamo exporter's graph of our
fused QKV GEMM (one MatMul, Slice / Squeeze) and additive ``-inf`` mask. Hugging Face's own
BertModel exported with ``dynamo=True`` is not fused either.

The TorchScript exporter (``dynamo=False``) is not used: on this code base it produced wrong
numbers (max diff 2.6 on the tiny model, even at the traced shape), most likely because the
fused QKV weight aliases the storage of ``q_linear`` / ``k_linear`` / ``v_linear``.

Opsets: only ``MIN_OPSET..MAX_OPSET`` are accepted (:func:`check_opset`, before any work), and
the written file's default-domain opset is checked against the request before anything is
written, so the file never claims an opset that was not asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import operator
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..encoder.model import BertModel
from ..errors import MissingExtraError, UsageError
from ..files import check_output, write_atomic

__all__ = [
    "export_onnx",
    "export_attention_onnx",
    "check_opset",
    "EXPORT_BACKENDS",
    "DEFAULT_OPSET",
    "MIN_OPSET",
    "MAX_OPSET",
]

#: backends whose graph does not depend on the data (``varlen`` does: see the module docstring)
EXPORT_BACKENDS = ("math", "sdpa")
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# The default-domain opsets written exactly as asked. Measured with torch 2.13.0+cpu,
# onnx 1.23.2, onnxscript 0.7.2, onnxruntime 1.32.0, exporting both BertModel (tiny) and a bare
# MultiHeadAttention with backends math and sdpa, then reading ``opset_import`` and running the
# file in ONNX Runtime against PyTorch (max diff <= 7e-7 at every opset kept):
# * 18..25: the exporter's own opsets (it builds at 18; onnxscript's converter moves to 19..25).
# * 17: down-converted by the onnx C API fallback; it works for our graphs (LayerNormalization
#   is opset 17). At 16 and below the conversion fails on LayerNormalization and the exporter
#   silently writes 18 for BertModel (but 16 for the attention alone): graph-dependent, refused.
#   Anything below 17 (7, 9, 13, ...) is written as 18, whatever is asked.
# * 26..28: up-converted by the onnx C API fallback; the attention alone comes out right but
#   BertModel fails ("No Op registered for Gelu"), so they are refused. 29 and up: onnx (max 28)
#   cannot convert, the exporter writes 18; ONNX Runtime 1.32 refuses files above opset 28.
# * Known ONNX Runtime 1.32 issue, not an opset lie: with backend "sdpa" at opsets 23 and 24 the
#   exporter emits the ONNX ``Attention`` op, and ONNX Runtime's kernel for those versions
#   rejects our broadcast (batch, 1, 1, seq) padding mask at run time ("inconsistent
#   q_sequence_length"); opset 25 and backend "math" (the default) run fine.
MIN_OPSET = 17
MAX_OPSET = 25
DEFAULT_OPSET = 18


def check_opset(opset: object) -> int:
    """``opset`` as an int, or :class:`~bertattn.errors.UsageError` (a ``ValueError``) when the
    exporter cannot write it exactly: outside ``MIN_OPSET..MAX_OPSET``, not an int, or a bool."""
    hint = f"pass --opset {DEFAULT_OPSET} (the default) or another in {MIN_OPSET}..{MAX_OPSET}"
    try:
        if isinstance(opset, bool):
            raise TypeError
        value = operator.index(opset)  # type: ignore[arg-type]  (int, numpy ints; not 18.0)
    except TypeError:
        raise UsageError(
            f"opset must be an int, got {opset!r} ({type(opset).__name__}); {hint}"
        ) from None
    if not MIN_OPSET <= value <= MAX_OPSET:
        raise UsageError(
            f"opset {value} is not supported: the exporter writes opsets "
            f"{MIN_OPSET}..{MAX_OPSET}; {hint}"
        )
    return value


def _require_onnx():  # type: ignore[no-untyped-def]
    """The ``onnx`` module, after checking that the exporter's dependencies import."""
    try:
        import onnx
        import onnxscript  # noqa: F401  (the dynamo exporter needs it)
    except ImportError as exc:
        raise MissingExtraError("ONNX export", exc.name or "onnxscript", "onnx") from None
    return onnx


def _check_output(path: str | Path) -> Path:
    return check_output(path, what="ONNX file")


def _check_backend(backend: str) -> None:
    if backend == "varlen":
        raise ValueError(
            "backend 'varlen' cannot be exported to ONNX: it packs the batch with offsets read "
            "from the padding mask and loops over the sequences in Python, so its graph depends "
            "on the data. Export with backend='math' (default, fastest in ONNX Runtime) or "
            "'sdpa'; the padding mask stays an input either way."
        )
    if backend not in EXPORT_BACKENDS:
        raise ValueError(f"backend {backend!r} cannot be exported; use one of {EXPORT_BACKENDS}.")


@contextlib.contextmanager
def _export_mode(module: nn.Module, backend: str) -> Iterator[None]:
    """Eval mode and ``backend`` on every attention module, restored afterwards."""
    attns = [m for m in module.modules() if isinstance(m, MultiHeadAttention)]
    old = [m.backend for m in attns]
    was_training = module.training
    try:
        for m in attns:
            m.backend = backend
        module.eval()
        yield
    finally:
        for m, b in zip(attns, old, strict=True):
            m.backend = b
        module.train(was_training)


class _BertForExport(nn.Module):
    """``BertModel`` with plain tensor outputs (ONNX has no dataclasses)."""

    def __init__(self, model: BertModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor
    ) -> tuple[Tensor, ...]:
        out = self.model(input_ids, attention_mask, token_type_ids)
        if out.pooler_output is None:
            return (out.last_hidden_state,)
        return out.last_hidden_state, out.pooler_output  # (B, L, E), (B, E)


class _AttentionForExport(nn.Module):
    def __init__(self, module: MultiHeadAttention) -> None:
        super().__init__()
        self.attn = module

    def forward(self, x: Tensor, key_padding_mask: Tensor) -> Tensor:
        return self.attn(x, key_padding_mask=key_padding_mask, need_weights=False)[0]


def _example_mask(batch: int, length: int) -> Tensor:
    """Some padding in the example, so no mask value is baked into the graph."""
    mask = torch.ones(batch, length, dtype=torch.long)  # (B, L)
    mask[-1, length // 2 :] = 0
    return mask


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's noise that says nothing about the user's model: torchvision
    ops it skips, torch-internal deprecations, and axis renaming (ours share one Dim)."""
    loggers = [
        logging.getLogger("torch.onnx._internal.exporter._registration"),
        # "not supported by the onnxscript version converter and fallback is enabled" (opset 17)
        logging.getLogger("onnxscript.version_converter"),
        # "Setting ONNX exporter to use operator set version 18 because the requested
        # opset_version 17 is a lower version ...": the file is converted to the opset asked
        # for, and check_opset / the summary line say which it is
        logging.getLogger("torch.onnx._internal.exporter._compat"),
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message="# The axis name")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _export(
    wrapper: nn.Module,
    args: tuple[Tensor, ...],
    path: str | Path,
    *,
    input_names: list[str],
    output_names: list[str],
    dynamic_shapes: dict[str, dict[int, object]],
    opset: int,
    metadata: dict[str, str],
) -> Path:
    opset = check_opset(opset)
    out = _check_output(path)
    onnx = _require_onnx()
    wrapper.eval()
    with torch.no_grad(), _quiet_exporter():  # verbose=False: no progress lines on stdout
        program = torch.onnx.export(
            wrapper,
            args,
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            verbose=False,
        )
    proto = program.model_proto
    written = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    if written != [opset]:  # the exporter falls back to its own opset when a conversion fails
        raise RuntimeError(
            f"the ONNX exporter wrote opset {', '.join(map(str, written)) or 'none'} instead of "
            f"the requested {opset}; nothing was written to {out}. Export with --opset "
            f"{DEFAULT_OPSET} (the default)."
        )
    for key, value in {**metadata, "bertattn.opset": str(opset)}.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    return write_atomic(out, proto.SerializeToString())  # weights inline (models < 2 GB)


def export_onnx(
    model_or_path: BertModel | str | Path | None,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    backend: str = "math",
) -> Path:
    """Write ``model_or_path`` (a :class:`BertModel`, a model folder, or None for the default
    all-MiniLM-L6-v2) as one ONNX file at ``path``, atomically.

    Inputs ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids``: int64
    ``(batch, seq)``, both axes dynamic (seq up to ``max_position_embeddings``). Outputs
    ``last_hidden_state (batch, seq, E)`` and ``pooler_output (batch, E)`` (when the model has a
    pooler). The model's config is stored in the file's metadata (``bertattn.config``).
    ``opset`` must be in ``MIN_OPSET..MAX_OPSET`` (:func:`check_opset`); the file is written
    at exactly that opset or not at all.
    """
    opset = check_opset(opset)  # every refusal before the model is loaded or traced
    _check_backend(backend)
    _check_output(path)
    _require_onnx()
    if isinstance(model_or_path, BertModel):
        model = model_or_path
    else:
        from ..encoder.folder import resolve_model

        model = BertModel.from_pretrained(resolve_model(model_or_path))
    from ..families import registry

    registry.require(model.config.family, "onnx", "ONNX export")
    if model.dtype != torch.float32:
        model = model.float()  # ONNX Runtime's CPU kernels are float32; parity is tested there
    cfg = model.config
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("seq", max=cfg.max_position_embeddings)
    axes = {0: batch, 1: seq}
    b, length = 2, 8
    ids = torch.randint(1, cfg.vocab_size, (b, length))
    args = (ids, _example_mask(b, length), torch.zeros_like(ids))
    outputs = ["last_hidden_state"] + ([] if model.pooler is None else ["pooler_output"])
    config = {"model_type": "bert", **dataclasses.asdict(cfg)}
    with _export_mode(model, backend):
        return _export(
            _BertForExport(model),
            args,
            path,
            input_names=list(BERT_INPUTS),
            output_names=outputs,
            dynamic_shapes={name: axes for name in BERT_INPUTS},
            opset=opset,
            metadata={
                "bertattn.kind": "bert",
                "bertattn.family": cfg.family,
                "bertattn.backend": backend,
                "bertattn.config": json.dumps(config),
                "bertattn.source": model.name_or_path,
            },
        )


def export_attention_onnx(
    module: MultiHeadAttention,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    backend: str = "math",
) -> Path:
    """Write a bare :class:`MultiHeadAttention` (self-attention) as ONNX at ``path``.

    Inputs ``x (batch, seq, E)`` float32 and ``key_padding_mask (batch, seq)`` int64 (1 = real
    token); output ``output (batch, seq, E)``, zeros for a query with no key (never NaN).
    ``opset``: as for :func:`export_onnx`.
    """
    opset = check_opset(opset)
    if not isinstance(module, MultiHeadAttention):
        raise ValueError(f"expected a MultiHeadAttention, got {type(module).__name__}.")
    _check_backend(backend)
    if module.out_linear.weight.dtype != torch.float32:
        raise ValueError("export a float32 module: call module.float() first.")
    _check_output(path)
    _require_onnx()
    axes = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    b, length = 2, 8
    x = torch.randn(b, length, module.embed_dim, device=module.out_linear.weight.device)
    args = (x, _example_mask(b, length).to(x.device))
    meta = {"embed_dim": module.embed_dim, "num_heads": module.num_heads}
    with _export_mode(module, backend):
        return _export(
            _AttentionForExport(module),
            args,
            path,
            input_names=["x", "key_padding_mask"],
            output_names=["output"],
            dynamic_shapes={"x": axes, "key_padding_mask": axes},
            opset=opset,
            metadata={
                "bertattn.kind": "attention",
                "bertattn.backend": backend,
                "bertattn.config": json.dumps(meta),
            },
        )
