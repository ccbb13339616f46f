"""Opt-in int8 inference on the CPU: ``Bert.load(..., dtype="int8")``.

Every matrix product of the encoder layers (the fused q/k/v projection, the attention output,
the two feed-forward linears) runs in int8 on oneDNN (``torch.ops.onednn.qlinear_pointwise``:
AMX or VNNI kernels where the CPU has them, in the form they take:
:mod:`bertattn.encoder.int8_forms`); the embeddings and the pooler stay in float32, and every
LayerNorm, the attention, the GELU and the residual stream run in float32, or in bfloat16
where it is native and fast here (``around``: :mod:`bertattn.encoder.int8_around`).

* Weights: int8, symmetric, one scale per output channel, quantized once when the model loads.
* Activations: int8, asymmetric, one scale and zero point per token, computed on each call
  (dynamic). The zero point is corrected after the product with each weight row's sum.
* SmoothQuant (alpha 0.6) on the inputs of the q/k/v, attention-output and first feed-forward
  linears: a per-channel factor, measured on :data:`CALIBRATION`, moves activation outliers into
  the weights (divided out of the activations as they are quantized).
* The second feed-forward linear reads GELU outputs, which lie in ``[GELU_MIN, gelu(max u)]``:
  each token's range comes from the row maximum of the pre-activation ``u``, so the GELU runs
  once per element. Where the products take 7-bit weights (u8 x s7, AVX2 without VNNI), this
  one takes 8-bit weights and 7-bit activations instead (:func:`~.int8_forms.gelu_form`).

The quantize and dequantize steps around each product are fused with the bias, the residual
add, the LayerNorm and the GELU into five small kernels compiled once by ``torch.compile``
(inductor's C++ backend, so a C++ compiler must be present; dynamic in the number of rows
only for BERT's three fused steps, the widths static: no recompile per batch, their loops
compiled for the model's widths; the first load compiles for ~5-20 s, later processes reuse
inductor's cache). Done eagerly those steps cost more than the int8 products save (measured:
paragraphs slower than float32). The products write the output dtype of the form the CPU runs
fastest and exactly (float32; bfloat16 or float16 only on CPUs with those types native, and
float16 only where a bound on the product's magnitude fits it).

When the model loads, int8 must first be worth it: one int8 product is timed against the same
float32 product in each form the CPU offers (:func:`check_speed`, bounded: a fraction
of a second where int8 is fast, and the timing stops early where it is not); the fastest form
that is exact and at least :data:`MIN_SPEEDUP` times float32's speed is kept, and without one
int8 is refused (``ValueError`` naming each form's speeds, ratio and error, and the CPU): signed
activations on a VNNI CPU without AMX run oneDNN's reference kernel (a Zen 4 EPYC: 0.001x),
and without VNNI 8-bit weights saturate (7-bit ones are offered there).
Both come before anything is quantized. Then :func:`verify` compares the model with its own
float32 path on :data:`CALIBRATION` and refuses it (``ValueError``) when a sentence
embedding's cosine is below 0.99, the mean below 0.998, or a text keeps fewer than 90% of its
10 nearest neighbours. ``dtype="auto"`` never chooses int8.

The float32 weights stay in the model (its ``state_dict`` is the checkpoint's): attention
weights asked for, training mode, autograd through the input, a recorded steps block, a
non-CPU input or one neither float32 nor the dtype around the products all run the float32
layer instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import PreparedMask, get_backend
from ..attention.dispatch import choose_backend
from ..blocks.block import EncoderBlock
from ..blocks.contract import INT8, Packing, offers
from ..dtypes import dtype_name
from ..runtime.cpu import cpu_flags
from .compile_errors import explain_failure
from .int8_around import FLOAT32_AROUND, Around, choose_around
from .int8_blocks import fuse, install, int8_runs, observing, products
from .int8_forms import U8_F32, Form, gelu_form
from .int8_speed import MIN_SPEEDUP, Speed, check_speed, time_speed
from .int8_steps import QMIN, compiled
from .int8_steps import codes as _codes
from .int8_steps import dequantize as _dequantize
from .int8_steps import quantize as _quantize
from .model import BertLayer, BertModel

if TYPE_CHECKING:
    from .pipeline import Bert

__all__ = [
    "CALIBRATION",
    "Fidelity",
    "Int8Linear",
    "Int8BertLayer",
    "available",
    "quantize_model",
    "verify",
    "MIN_COSINE",
    "MEAN_COSINE",
    "NEIGHBOURS_KEPT",
    "MIN_SPEEDUP",
    "Speed",
    "check_speed",
    "failure_message",
    "time_speed",
]

log = logging.getLogger(__name__)

#: the bars :func:`verify` holds the int8 model to (sentence embeddings against float32)
MIN_COSINE = 0.99
MEAN_COSINE = 0.998
NEIGHBOURS_KEPT = 0.9  # of each text's 10 nearest neighbours
NEIGHBOURS = 10

#: SmoothQuant's migration strength (0: none, 1: all of the activation range into the weights);
#: 0.6 measured best of 0.5-0.8 on 500 held-out sentences (all-MiniLM-L6-v2)
ALPHA = 0.6

#: the minimum of the exact GELU (-0.169971 at u = -0.7518), rounded outwards
GELU_MIN = -0.17

#: a product written in float16 must stay below this (float16's largest is 65504)
_F16_LIMIT = 60000.0

#: The built-in calibration and verification texts: six topics of eleven sentences, so each
#: text's ten nearest neighbours are mostly its own topic's and a neighbour lost means the
#: embedding moved, not that two near-equal scores swapped.
CALIBRATION: tuple[str, ...] = (
    # cooking
    "Simmer the tomato sauce for twenty minutes and stir it now and then.",
    "Knead the bread dough until it feels smooth and springs back when pressed.",
    "Roast the vegetables with olive oil, garlic and a pinch of salt.",
    "Whisk the eggs and sugar together before folding in the flour.",
    "Let the steak rest for five minutes after it comes off the grill.",
    "A sharp knife makes chopping onions faster and safer.",
    "Marinate the chicken overnight in yogurt, lemon and spices.",
    "Bring a large pot of salted water to the boil for the pasta.",
    "The soup tastes better the next day once the flavours have blended.",
    "Brown the butter in a pan until it smells nutty, then add the sage.",
    "Preheat the oven and line the baking tray with parchment paper.",
    # astronomy
    "The telescope captured a faint spiral galaxy millions of light years away.",
    "Jupiter's great red spot is a storm larger than the Earth.",
    "A solar eclipse happens when the Moon passes between the Sun and the Earth.",
    "Astronomers detected a planet orbiting in its star's habitable zone.",
    "The light from distant stars tells us what elements they contain.",
    "Saturn's rings are made of countless pieces of ice and rock.",
    "A neutron star packs more mass than the Sun into a city-sized sphere.",
    "The comet's tail always points away from the Sun.",
    "Meteor showers occur when the Earth crosses a comet's trail of dust.",
    "The Milky Way contains hundreds of billions of stars.",
    "Black holes bend light so strongly that nothing escapes from inside them.",
    # software
    "The function raises an exception when the input file does not exist.",
    "Run the unit tests before merging the branch into main.",
    "The database query was slow until we added an index on the user column.",
    "Refactor the parser so that each rule lives in its own method.",
    "The server returns a 404 error when the requested page is missing.",
    "Use a virtual environment to keep the project's dependencies isolated.",
    "The compiler reports a type error on line twelve of the module.",
    "Caching the results of the expensive call made the API twice as fast.",
    "The memory leak came from a list that was never cleared.",
    "Write the configuration to a JSON file and read it back at startup.",
    "The script retries the network request three times before giving up.",
    # sport
    "The striker scored twice in the second half to win the match.",
    "She finished the marathon in under three hours.",
    "The tennis final went to five sets and lasted four hours.",
    "The goalkeeper saved a penalty in the last minute of the game.",
    "The cyclist attacked on the final climb and won the stage.",
    "Our team lost the basketball game by a single point.",
    "The swimmer broke the world record in the two hundred metres.",
    "The referee showed a red card after a dangerous tackle.",
    "He trains every morning before work to prepare for the triathlon.",
    "The crowd cheered as the runner crossed the finish line first.",
    "The coach changed tactics at half time and the team came back.",
    # weather
    "Heavy rain is expected across the region tomorrow afternoon.",
    "A thick fog covered the valley until late in the morning.",
    "The temperature dropped below freezing and the roads turned icy.",
    "Strong winds knocked down trees and power lines overnight.",
    "The forecast promises sunshine and clear skies for the weekend.",
    "A thunderstorm rolled in with lightning and hail.",
    "Snow fell all night and buried the cars in the street.",
    "The heatwave pushed temperatures above forty degrees.",
    "Humid air made the evening feel much warmer than it was.",
    "The hurricane is expected to reach the coast by Thursday.",
    "A light drizzle continued through the afternoon.",
    # finance
    "The central bank raised interest rates to slow inflation.",
    "Shares of the company fell after its quarterly earnings disappointed.",
    "She opened a savings account to put money aside for a house.",
    "The loan must be repaid in monthly instalments over five years.",
    "Investors moved their money into bonds as the stock market fell.",
    "The budget shows a deficit for the third year in a row.",
    "Rising prices have reduced what households can afford to buy.",
    "The bank charges a small fee for every international transfer.",
    "A diversified portfolio spreads risk across many assets.",
    "The currency weakened against the dollar after the announcement.",
    "Mortgage payments went up when the fixed rate period ended.",
)


# ---------------------------------------------------------------------------- fused kernels
# Plain torch code, compiled once by :func:`_kernels`, on the per-token
# quantize and dequantize steps of :mod:`bertattn.encoder.int8_steps` (``levels``, the codes
# from ``QMIN`` and ``sz`` are described there).


def _qkv(
    x: Tensor, inv: Tensor, levels: int, unsigned: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    return _quantize(x, inv, levels, unsigned)


def _dequant_res_ln_quant(
    y: Tensor,
    s: Tensor,
    sz: Tensor,
    bias: Tensor,
    col: Tensor,
    x: Tensor,
    weight: Tensor,
    ln_bias: Tensor,
    eps: float,
    inv: Tensor,
    levels: int,
    unsigned: bool = False,
    out: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention output: dequantize, add the residual, LayerNorm (:func:`_dequant_res_ln`); and
    quantize the result for the first feed-forward linear (from its float32 value; the residual
    is written in ``out``)."""
    h = _dequant_res_ln(y, s, sz, bias, col, x, weight, ln_bias, eps)
    return (h.to(out), *_quantize(h, inv, levels, unsigned))


def _dequant_gelu_quant(
    y: Tensor, s: Tensor, sz: Tensor, bias: Tensor, col: Tensor, levels: int, unsigned: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """First feed-forward linear: dequantize, GELU, quantize per token for the second. The
    exact GELU rises for u > -0.75 and never goes below ``GELU_MIN``, so a row's outputs lie in
    ``[GELU_MIN, gelu(max u)]``: the row max of ``u`` (written apart so that the compiler
    recomputes ``u`` instead of storing it) gives the scale, and the GELU runs once per
    element."""
    qmin = QMIN
    top = (y.float() * s + (bias - sz * col)).amax(-1, keepdim=True)
    hi = F.gelu(top).clamp(min=0.0)
    scale = ((hi - GELU_MIN) / levels).clamp(min=1e-12)
    z = torch.round(-GELU_MIN / scale) + qmin
    g = F.gelu(_dequantize(y, s, sz, bias, col))
    q = _codes(torch.round(g * (1.0 / scale) + z).clamp(qmin, qmin + levels), unsigned)
    return q, scale, scale * z


def _dequant_res_ln(
    y: Tensor,
    s: Tensor,
    sz: Tensor,
    bias: Tensor,
    col: Tensor,
    x: Tensor,
    weight: Tensor,
    ln_bias: Tensor,
    eps: float,
    out: torch.dtype = torch.float32,
) -> Tensor:
    """Second feed-forward linear: dequantize, add the residual (float32 or bfloat16), LayerNorm
    in float32, written in ``out``."""
    h = x + _dequantize(y, s, sz, bias, col)
    return F.layer_norm(h, (x.shape[-1],), weight, ln_bias, eps).to(out)


@dataclass(frozen=True)
class _Kernels:
    quantize: object
    dequantize: object
    dequant_res_ln_quant: object
    dequant_gelu_quant: object
    dequant_res_ln: object


@functools.cache
def _kernels() -> _Kernels:
    """The five fused steps, compiled on first use, one graph each for every batch shape.
    BERT's three fused steps are dynamic in the rows only
    (:func:`~bertattn.encoder.int8_steps.compiled`; every tensor they take is ``(M, width)``
    rows, a padded batch flattened to ``B * L`` rows, or a 1-D vector of a width). The quantize
    and dequantize of every :class:`Int8Linear`, whatever its widths (those of every family's
    products), keep every size dynamic: static widths there recompiled per product shape and
    reached dynamo's recompile limit in one process."""

    def dynamic(fn):  # type: ignore[no-untyped-def]
        return torch.compile(fn, dynamic=True, fullgraph=True)

    return _Kernels(
        dynamic(_qkv),
        dynamic(_dequantize),
        compiled(_dequant_res_ln_quant),
        compiled(_dequant_gelu_quant),
        compiled(_dequant_res_ln),
    )


@functools.cache
def available() -> str | None:
    """None when the int8 path can run here: a torch build with oneDNN's int8 linear;
    otherwise why not. Whether it is worth running is timed, form by form
    (:func:`check_speed`), not read from the CPU's flags: a CPU without VNNI still runs
    unsigned activations by 7-bit weights exactly at about twice float32's speed (an AVX2 AMD
    EPYC Zen 3), while a CPU with VNNI but no AMX runs signed activations on a reference kernel
    (a Zen 4: 0.001x)."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        torch.ops.onednn.qlinear_prepack  # noqa: B018
        torch.ops.onednn.qlinear_pointwise  # noqa: B018
    except (AttributeError, RuntimeError):
        return "this torch build has no onednn.qlinear_pointwise"
    return None


def verdict() -> str:
    """One line: the form int8 runs in on this CPU and its measured speed, and what
    ``int8_around="auto"`` puts around it for BERT's layer at MiniLM's widths
    (:mod:`bertattn.encoder.int8_around`), or why int8 is refused (the flags, or every form's
    numbers). Times the forms once per process."""
    why = available()
    if why is not None:
        return f"refused: {why}"
    try:
        speed = check_speed()
    except ValueError as exc:
        return str(exc)
    return f"runs as {speed}; {choose_around('auto')}"


def cpu_int8_isa() -> str:
    """The int8 matrix instructions of this CPU as /proc/cpuinfo names them (``amx_int8``,
    ``avx512_vnni``, ``avx_vnni``), ``"none"``, or ``"unknown"`` where the flags cannot be read."""
    flags = cpu_flags()
    if not flags:
        return "unknown"
    found = [n for n in ("amx_int8", "avx512_vnni", "avx_vnni") if n in flags]
    return ", ".join(found) or "none"


# ---------------------------------------------------------------------------- Int8Linear
_ONE = torch.tensor(1.0)
_ZERO = torch.tensor(0, dtype=torch.int32)
_U8_ZERO = torch.tensor(128, dtype=torch.int32)  # uint8 codes are the int8 ones plus 128


class Int8Linear(nn.Module):
    """An ``nn.Linear`` in int8: weights per output channel (symmetric), activations per token
    (asymmetric, dynamic), float32 in and out.

    Args:
        weight: ``(N, K)`` float weights; bias: ``(N,)`` or None.
        smooth: ``(K,)`` SmoothQuant factors (None: none): the weights are quantized times
            ``smooth`` and each input divided by it, so the product is unchanged.
        bits: activation bits (8; fewer only to test the refusal path).
        form: how the product is called (:mod:`bertattn.encoder.int8_forms`): u8 or s8
            activations, and its output dtype (a float16 output only where the product's
            bound fits float16, else float32).

    The buffers are not persistent: a model's ``state_dict`` stays its float32 checkpoint.
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        smooth: Tensor | None = None,
        bits: int = 8,
        form: Form = U8_F32,
    ) -> None:
        super().__init__()
        if not 2 <= bits <= 8:
            raise ValueError(f"bits must be in 2..8, got {bits!r}.")
        with torch.no_grad():
            w = weight.detach().to("cpu", torch.float32)
            n, k = w.shape
            s = torch.ones(k) if smooth is None else smooth.detach().to("cpu", torch.float32)
            w = w * s
            top = form.weight_limit  # 127, or 63 for 7-bit weights
            scale = (w.abs().amax(1) / top).clamp(min=1e-12)  # (N,)
            wq = torch.round(w / scale[:, None]).clamp(-top, top).to(torch.int8)
            b = torch.zeros(n) if bias is None else bias.detach().to("cpu", torch.float32)
            self.register_buffer("weight_int8", wq, persistent=False)
            self.register_buffer("weight_scale", scale.contiguous(), persistent=False)
            self.register_buffer("bias", b.clone().contiguous(), persistent=False)
            self.register_buffer("inv_smooth", (1.0 / s).contiguous(), persistent=False)
            # each row's sum times its scale: the correction for the activations' zero point
            col = (wq.sum(1, dtype=torch.int64).float() * scale).contiguous()
            self.register_buffer("col", col, persistent=False)
            # |q| <= 128, so |(q @ wq.T) * scale| <= 128 * sum|wq| * scale
            bound = float((wq.abs().sum(1, dtype=torch.int64).float() * scale).max()) * 128.0
        self.in_features, self.out_features = k, n
        self.levels = 2 ** min(bits, form.activation_bits) - 1
        self.form = form
        #: the activations go to the product as uint8 (plus 128, zero point 128)
        self.unsigned = form.unsigned
        #: what the product writes: the form's dtype; float32 where float16 cannot hold it
        too_big = form.out == torch.float16 and bound >= _F16_LIMIT
        self.out_dtype = torch.float32 if too_big else form.out
        self._packed: Tensor | None = None
        self._zp = torch.zeros(n, dtype=torch.long)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, smooth: Tensor | None = None, bits: int = 8, form: Form = U8_F32
    ) -> Int8Linear:
        return cls(linear.weight, linear.bias, smooth, bits, form)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bits={self.levels.bit_length()}, activations={self.form.activations}, "
            f"weight_bits={self.form.weight_bits}, "
            f"out_dtype={str(self.out_dtype).split('.')[-1]}"
        )

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_packed"] = None  # oneDNN's packed weight is opaque: packed again on first use
        return state

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        out = super()._apply(fn, recurse)
        if self.weight_int8.device.type != "cpu" or self.weight_int8.dtype != torch.int8:
            raise ValueError(
                "an int8 model runs on the CPU only, with its int8 weights as they are; load "
                "it in float32 (or bfloat16) to move or cast it."
            )
        self._packed = None
        return out

    def matmul(self, q: Tensor) -> Tensor:
        """``(M, K)`` int8 (or uint8: the int8 codes plus 128) -> ``(M, N)``
        ``(q @ wq.T) * weight_scale`` in :attr:`out_dtype`, ``q`` read as int8 codes."""
        packed = self._packed
        if packed is None:
            packed = self._packed = torch.ops.onednn.qlinear_prepack(self.weight_int8, None)
        zero = _U8_ZERO if q.dtype == torch.uint8 else _ZERO
        return torch.ops.onednn.qlinear_pointwise.tensor(
            q, _ONE, zero, packed, self.weight_scale, self._zp, None, 1.0, 0,
            self.out_dtype, "none", [], "",
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K)`` float32 -> ``(..., N)`` float32."""
        k = _kernels()
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        q, s, sz = k.quantize(rows, self.inv_smooth, self.levels, self.unsigned)  # type: ignore[operator]
        y = k.dequantize(self.matmul(q), s, sz, self.bias, self.col)  # type: ignore[operator]
        return y.view(*shape[:-1], self.out_features)


# ---------------------------------------------------------------------------- the layer
class Int8BertLayer(BertLayer):
    """A :class:`~bertattn.families.bert_layers.BertLayer` whose four products run in int8.

    It keeps the float32 layer's modules under their names (so the ``state_dict`` and every
    reader of ``attn.out_linear.weight`` see the checkpoint) and adds ``int8`` (the
    :class:`Int8Linear` of ``qkv``, ``out``, ``fc_in``, ``fc_out``). ``int8_enabled`` False, or
    a call the int8 path does not cover (see the module doc), runs the float32 layer.

    ``around``: the dtype between the products (:mod:`bertattn.encoder.int8_around`): float32,
    or bfloat16 (q, k, v, the attention and its output, the layer's output); the layer takes
    float32 or ``around`` in. Set by :func:`quantize_model` (``around=``).
    """

    def __init__(
        self,
        layer: BertLayer,
        smooth: dict[str, Tensor | None] | None = None,
        bits: int = 8,
        form: Form = U8_F32,
    ) -> None:
        nn.Module.__init__(self)
        for name, mod in layer._modules.items():
            self.add_module(name, mod)
        self.train(layer.training)
        smooth = smooth or {}
        attn, mlp = self.attn, self.mlp
        if mlp.act is not F.gelu:
            raise ValueError(
                "int8 supports the exact GELU feed-forward (hidden_act 'gelu') only; this "
                "model uses another activation."
            )
        w, b = attn.qkv_weight()
        self.int8 = nn.ModuleDict(
            {
                "qkv": Int8Linear(w, b, smooth.get("qkv"), bits, form),
                "out": Int8Linear.from_linear(attn.out_linear, smooth.get("out"), bits, form),
                "fc_in": Int8Linear.from_linear(mlp.fc_in, smooth.get("fc_in"), bits, form),
                "fc_out": Int8Linear.from_linear(mlp.fc_out, None, bits, gelu_form(form)),
            }
        )
        self.int8_enabled = True
        self.around = torch.float32

    def _int8_runs(self, x: Tensor) -> bool:
        return int8_runs(self, x, self.around)

    def _widened(self, x: Tensor) -> Tensor:
        """``x`` for the float32 layer: a bfloat16 residual stream (from an int8 layer before,
        ``around`` bfloat16) back in float32."""
        return x.float() if x.dtype != torch.float32 and x.dtype == self.around else x

    def forward(
        self, x: Tensor, mask: PreparedMask, need_weights: bool = False, lean: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        if need_weights or not self._int8_runs(x):
            return super().forward(self._widened(x), mask, need_weights, lean)
        attn = self.attn
        name, reason = choose_backend(
            attn.backend,
            need_weights=False,
            device_type="cpu",
            dtype=self.around,  # what the attention computes in
            key_len=x.size(1),
            training=False,
        )
        spec = get_backend(name)
        if spec.layout == "packed":  # asked for a packed backend on a padded call: as fp32 does
            return super().forward(self._widened(x), mask, need_weights, lean)
        b, length, e = x.shape
        h, d = attn.num_heads, attn.head_dim
        rows = x.reshape(b * length, e)
        qkv = self._qkv(rows).view(b, length, 3, h, d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, L, D) each
        context, _ = spec.fn(q, k, v, mask.bias, dropout_p=0.0, need_weights=False)
        if mask.live_rows is not None:  # rows with no key at all: zero context
            context = context.masked_fill(~mask.live_rows, 0.0)
        attn._record(attn.backend, name, reason, q)
        context = context.transpose(1, 2).reshape(b * length, e)
        return self._after_attention(rows, context).view(b, length, e), None

    def forward_packed(
        self,
        x: Tensor,
        packing: Packing,
        lean: bool = False,
        bias: tuple[Tensor | None, ...] | None = None,
    ) -> Tensor:
        """Packed ``(T, E)`` -> ``(T, E)`` on the packed backend the model chose
        (``packing.backend``), the four products in int8."""
        spec = get_backend(packing.backend)
        if not self._int8_runs(x) or (bias is not None and not spec.packed_bias):
            return super().forward_packed(self._widened(x), packing, lean, bias)
        t, e = x.shape
        h, d = self.attn.num_heads, self.attn.head_dim
        q, k, v = self._qkv(x).view(t, 3, h, d).unbind(1)  # (T, H, D) each
        packed = packing.batch
        if bias is None:
            context = spec.fn(q, k, v, packed, dropout_p=0.0)
        else:
            context = spec.fn(q, k, v, packed, dropout_p=0.0, bias=bias)
        self.attn._record(self.attn.backend, packing.backend, packing.reason, q)
        return self._after_attention(x, context.reshape(t, e))

    def _qkv(self, rows: Tensor) -> Tensor:
        """``(M, E)`` -> the ``(M, 3E)`` q/k/v projection, in :attr:`around`."""
        kern = _kernels()
        lin = self.int8["qkv"]
        q, s, sz = kern.quantize(rows, lin.inv_smooth, lin.levels, lin.unsigned)  # type: ignore[operator]
        return kern.dequantize(lin.matmul(q), s, sz, lin.bias, lin.col, self.around)  # type: ignore[operator]

    def _after_attention(self, rows: Tensor, context: Tensor) -> Tensor:
        """The attention output projection, residual + LayerNorm, and the feed-forward block
        with its residual + LayerNorm, on ``(M, E)`` rows; the output in :attr:`around`."""
        kern = _kernels()
        lins = self.int8
        out, fc_in, fc_out = lins["out"], lins["fc_in"], lins["fc_out"]
        n1, n2 = self.attn_norm, self.mlp_norm
        q, s, sz = kern.quantize(context, out.inv_smooth, out.levels, out.unsigned)  # type: ignore[operator]
        x1, q, s, sz = kern.dequant_res_ln_quant(  # type: ignore[operator]
            out.matmul(q), s, sz, out.bias, out.col, rows, n1.weight, n1.bias, n1.eps,
            fc_in.inv_smooth, fc_in.levels, fc_in.unsigned, self.around,
        )  # fmt: skip
        q, s, sz = kern.dequant_gelu_quant(  # type: ignore[operator]
            fc_in.matmul(q), s, sz, fc_in.bias, fc_in.col, fc_out.levels, fc_out.unsigned
        )
        return kern.dequant_res_ln(  # type: ignore[operator]
            fc_out.matmul(q), s, sz, fc_out.bias, fc_out.col, x1, n2.weight, n2.bias, n2.eps,
            self.around,
        )  # fmt: skip


# ---------------------------------------------------------------------------- quantize
def _int8_layers(model: BertModel) -> list[nn.Module]:
    """The int8 parts of ``model``: BERT's int8 layers and the blocks' int8 products."""
    return [la for la in model.encoder.layers if isinstance(la, Int8BertLayer)] + [
        p for p in products(model) if "int8" in p._modules
    ]


def is_int8(model: BertModel) -> bool:
    """Whether ``model``'s encoder was quantized (:func:`quantize_model`)."""
    return bool(_int8_layers(model))


@contextmanager
def float32_path(model: BertModel) -> Iterator[None]:
    """Run the int8 layers of ``model`` in float32 inside the block (the reference
    :func:`verify` compares with)."""
    layers = _int8_layers(model)
    before = [la.int8_enabled for la in layers]
    for la in layers:
        la.int8_enabled = False
    try:
        yield
    finally:
        for la, was in zip(layers, before, strict=True):
            la.int8_enabled = was


def _calibrate(bert: Bert, texts: Sequence[str]) -> None:
    """Run ``texts`` through ``bert``'s model in float32, each text alone (no padding row)."""
    model = bert.model
    with torch.inference_mode(), float32_path(model):
        for enc in bert.tokenizer.encode_batch(list(texts), max_length=bert.max_length):
            model(input_ids=torch.tensor([enc.ids], device=model.device))


@contextmanager
def _observed(layers: Sequence[BertLayer]) -> Iterator[None]:
    """Inside the block, ``layers`` compute their products through observing
    :class:`~bertattn.encoder.int8_blocks.Product` modules (:func:`install`, on the same
    parameters), so each product keeps the range of its own input on whatever path the model
    runs: padded or packed (a packed backend calls each layer's ``forward_packed``, never its
    ``__call__``), lean or not. Then every layer gets its own modules back."""
    saved = [(la.attn.out_linear, dict(la.mlp.named_children())) for la in layers]
    try:
        found = [p for la in layers for p in install(la)]
        with observing(found):
            yield
    finally:
        for la, (out, mlp) in zip(layers, saved, strict=True):
            la.attn._modules.pop("qkv_product", None)
            la.attn.out_linear = out
            for name, child in mlp.items():
                setattr(la.mlp, name, child)


def _smoothing(bert: Bert, texts: Sequence[str], alpha: float) -> list[dict[str, Tensor]]:
    """SmoothQuant's per-channel factors for each layer's q/k/v, attention-output and first
    feed-forward inputs: ``amax(|x_j|) ** alpha / amax(|w_j|) ** (1 - alpha)`` over ``texts``,
    each text run alone (no padding row counts), seen by the products themselves
    (:func:`_observed`) on the layout the model runs."""
    layers = list(bert.model.encoder.layers)
    with _observed(layers):
        watched = [
            {"qkv": la.attn.qkv_product, "out": la.attn.out_linear, "fc_in": la.mlp.fc_in}
            for la in layers
        ]
        _calibrate(bert, texts)
    factors = []
    for i, watch in enumerate(watched):
        f = {}
        for name, p in watch.items():
            if p.seen is None:
                raise ValueError(
                    f"SmoothQuant's calibration saw no input of layer {i}'s {name} product "
                    f"({len(texts)} texts); expected texts that run through the model: pass "
                    f"texts with at least one text, or alpha=0 for no smoothing."
                )
            w, _ = p.float_weights()
            act = p.seen.clamp(min=1e-5)
            wmax = w.detach().float().abs().amax(0).clamp(min=1e-5)
            f[name] = (act**alpha / wmax ** (1.0 - alpha)).clamp(min=1e-5)
        factors.append(f)
    return factors


def quantize_model(
    bert: Bert,
    *,
    texts: Sequence[str] = CALIBRATION,
    alpha: float = ALPHA,
    bits: int = 8,
    around: str = "auto",
) -> Bert:
    """Make ``bert``'s encoder layers :class:`Int8BertLayer` (in place; returns ``bert``).

    ``texts``: what SmoothQuant's factors are measured on; ``alpha``: its strength (0: no
    smoothing); ``bits``: the activations' bits (8; fewer only to test :func:`verify`);
    ``around``: the dtype between the products, ``"float32"``, ``"bfloat16"`` or ``"auto"``
    (bfloat16 where ``dtype="auto"`` takes it here; :mod:`bertattn.encoder.int8_around`), kept
    in ``model.int8_around``.
    Refuses (``ValueError``) where int8 cannot run (:func:`available`) or is not faster
    (:func:`check_speed`), or bfloat16 around a family's blocks, after the arguments are
    checked and before anything is quantized.
    Does not verify: call :func:`verify` (``Bert.load(dtype="int8")`` does both). Sets
    ``model.chunk_workers = 1`` unless it was set: the int8 kernels measured slower on chunk
    workers.
    """
    why = available()
    if why is not None:
        raise ValueError(f"int8 cannot run here: {why}.")
    model = bert.model
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError(
            f"int8 quantizes a float32 model on the CPU; this one is {model.dtype} on "
            f"{model.device}."
        )
    if _int8_layers(model):
        raise ValueError("this model is int8 already.")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}.")
    # before anything is quantized or verified: a slow kernel costs seconds, once
    layers = model.encoder.layers
    for i, layer in enumerate(layers):
        if not offers(layer, INT8) and not isinstance(layer, EncoderBlock):
            raise ValueError(
                f"layer {i} is a {type(layer).__name__}, which offers no int8 path (BertLayer "
                f"declares 'int8' in its speed_paths; a family's EncoderBlock gets int8 "
                f"products): build the family from bertattn.blocks to quantize it."
            )
    cfg = model.config
    blocks = sorted({type(la).__name__ for la in layers if isinstance(la, EncoderBlock)})
    mix = choose_around(
        around,
        blocks=f"{cfg.family}'s {', '.join(blocks)}" if blocks else None,
        widths=(cfg.hidden_size, cfg.intermediate_size),
        threads=torch.get_num_threads(),
    )
    chosen = check_speed()
    if any(isinstance(la, EncoderBlock) for la in layers):
        _quantize_blocks(bert, texts, alpha, bits, chosen.form)
    bert_layers = any(offers(la, INT8) for la in layers)
    factors = _smoothing(bert, texts, alpha) if alpha > 0 and bert_layers else None
    for i, layer in enumerate(list(layers)):
        if offers(layer, INT8):
            smooth = None if factors is None else factors[i]
            layers[i] = Int8BertLayer(layer, smooth, bits, chosen.form)  # type: ignore[arg-type]
    #: what explain() and /info say of the int8 product: the form kept and its measurement
    model.int8_speed = chosen
    use_around(model, mix)
    if model.chunk_workers is None:
        # its chunks one after another: on chunk workers (bertattn.runtime.workers) the compiled
        # kernels ran slower (2-core AMX Xeon, MiniLM, texts/s, workers / serial: paragraphs
        # 90.8 / 104.3, short texts 1116 / 1334; float32 and bfloat16 are level or faster)
        model.chunk_workers = 1
    return bert


def use_around(model: BertModel, around: Around) -> None:
    """Run ``model``'s int8 layers with ``around`` between their products, and keep it in
    ``model.int8_around`` (what explain() and /info name)."""
    for layer in model.encoder.layers:
        if isinstance(layer, Int8BertLayer):
            layer.around = around.dtype
    model.int8_around = around
    log.info("int8 products with %s", around)


def _quantize_blocks(bert: Bert, texts: Sequence[str], alpha: float, bits: int, form: Form) -> None:
    """Give every :class:`~bertattn.blocks.EncoderBlock` of ``bert`` int8 products
    (:mod:`bertattn.encoder.int8_blocks`), SmoothQuant's factors from ``texts``, and the
    fused steps around its feed-forward products where the block's kinds allow
    (:func:`~bertattn.encoder.int8_blocks.fuse`)."""
    blocks = [la for la in bert.model.encoder.layers if isinstance(la, EncoderBlock)]
    found = [p for la in blocks for p in install(la)]
    if alpha > 0:
        with observing(found):
            _calibrate(bert, texts)

    def make(weight: Tensor, bias: Tensor | None, smooth: Tensor | None) -> nn.Module:
        return Int8Linear(weight, bias, smooth, bits, form)

    for p in found:
        p.quantize(make, alpha)
    for la in blocks:
        fuse(la)


# ---------------------------------------------------------------------------- verify
@dataclass(frozen=True)
class Fidelity:
    """Sentence embeddings of the int8 model against float32 on the same texts: the lowest and
    mean cosine, and the lowest and mean share of each text's nearest neighbours kept."""

    texts: int
    min_cosine: float
    mean_cosine: float
    min_kept: float
    mean_kept: float
    neighbours: int

    def passes(self) -> bool:
        return (
            self.min_cosine >= MIN_COSINE
            and self.mean_cosine >= MEAN_COSINE
            and self.min_kept >= NEIGHBOURS_KEPT
        )

    def __str__(self) -> str:
        return (
            f"on {self.texts} texts: min cosine {self.min_cosine:.5f} (bar {MIN_COSINE}), mean "
            f"cosine {self.mean_cosine:.5f} (bar {MEAN_COSINE}), each text keeps >= "
            f"{self.min_kept:.0%} of its {self.neighbours} nearest neighbours (mean "
            f"{self.mean_kept:.1%}; bar {NEIGHBOURS_KEPT:.0%})"
        )


def compare(reference: Tensor, embeddings: Tensor, neighbours: int = NEIGHBOURS) -> Fidelity:
    """:class:`Fidelity` of ``embeddings`` ``(N, E)`` against ``reference`` ``(N, E)``."""
    a = F.normalize(reference.double(), dim=1)
    b = F.normalize(embeddings.double(), dim=1)
    cos = (a * b).sum(1)
    n = a.shape[0]
    k = min(neighbours, n - 1)
    if k < 1:
        kept = torch.ones(n, dtype=torch.float64)
    else:

        def top(e: Tensor) -> Tensor:
            sim = e @ e.T
            sim.fill_diagonal_(-float("inf"))
            return sim.topk(k, dim=1).indices

        ta, tb = top(a), top(b)
        hit = (ta.unsqueeze(2) == tb.unsqueeze(1)).any(2)  # (N, k): a's neighbour in b's top
        kept = hit.double().mean(1)
    return Fidelity(
        n, float(cos.min()), float(cos.mean()), float(kept.min()), float(kept.mean()), k
    )


def failure_message(exc: BaseException) -> str:
    """What :func:`verify` says when the first int8 forward raised ``exc`` (see
    :func:`bertattn.encoder.compile_errors.explain_failure`): a missing C++ compiler only when
    that is the cause, a compiler that failed with its output, else the real cause."""
    return explain_failure(
        exc,
        what="int8",
        kernels="its fused kernels",
        call="its first int8 forward",
        instead="load the model in float32",
    )


def verify(bert: Bert, texts: Sequence[str] = CALIBRATION) -> Fidelity:
    """Encode ``texts`` with ``bert``'s int8 layers and with their float32 path; raise
    ``ValueError`` naming the measured cosines and neighbours kept when below the bars
    (:data:`MIN_COSINE`, :data:`MEAN_COSINE`, :data:`NEIGHBOURS_KEPT`); return the
    :class:`Fidelity` otherwise."""
    model = bert.model
    if not _int8_layers(model):
        raise ValueError("this model has no int8 layer to verify; call quantize_model first.")
    texts = list(texts)
    with torch.inference_mode(), float32_path(model):
        reference = bert.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    fidelity = compare(reference, _encode_int8(bert, texts))
    around = getattr(model, "int8_around", FLOAT32_AROUND)
    if not fidelity.passes() and around.auto and around.dtype != torch.float32:
        fidelity = _float32_around(bert, texts, reference, fidelity)
        around = model.int8_around
    if not fidelity.passes():
        if around.dtype == torch.float32:
            what, instead = "", "Load it in float32 (or bfloat16) instead."
        else:
            what = f" with {dtype_name(around.dtype)} around its products"
            instead = "Load it with int8_around='float32', or in float32 (or bfloat16), instead."
        raise ValueError(
            f"int8 quantization of {bert.name or 'this model'}{what} is refused: against "
            f"float32 {fidelity}. {instead}"
        )
    log.info("int8 %s verified against float32 %s", bert.name, fidelity)
    return fidelity


def _encode_int8(bert: Bert, texts: list[str]) -> Tensor:
    """``texts``' normalized sentence embeddings ``(N, E)`` through the int8 layers."""
    try:
        with torch.inference_mode():
            return bert.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    except Exception as exc:  # the first int8 call compiles the fused kernels
        raise RuntimeError(failure_message(exc)) from exc


def _float32_around(bert: Bert, texts: list[str], reference: Tensor, short: Fidelity) -> Fidelity:
    """``int8_around="auto"`` took bfloat16 and it fell ``short`` of the bars: float32 around
    the products instead, measured again against the same ``reference``."""
    log.info("int8 %s with bfloat16 around its products fell short %s; float32 around instead",
             bert.name, short)  # fmt: skip
    use_around(bert.model, Around(
        torch.float32,
        f"auto: bfloat16 around fell short of the fidelity bars (min cosine "
        f"{short.min_cosine:.4f}, mean {short.mean_cosine:.4f}, neighbours kept "
        f"{short.min_kept:.0%})",
        auto=True,
    ))  # fmt: skip
    return compare(reference, _encode_int8(bert, texts))
