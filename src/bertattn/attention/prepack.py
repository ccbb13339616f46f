"""Weights packed once for MKL's GEMM: CPU float32 inference at known row counts.

At the row counts of one short query (M = batch x tokens, a few dozen), MKL's ``sgemm`` spends a
large share of each ``F.linear`` call laying the weight out for its kernel (packing the B
matrix) before it multiplies. MKL can do that once (``cblas_sgemm_pack``); torch exposes it as
``torch.ops.mkl._mkl_reorder_linear_weight(weight, M)`` and
``torch.ops.mkl._mkl_linear(x, packed, weight, bias, M)``, the pair torch.compile's CPU
freezing pass uses. A packed weight serves only the row count it was packed for, and costs one
more copy of the weight in memory per row count. So packing is opt-in and per row count:
:func:`prepack` packs a module's GEMM weights for the counts you name; every GEMM call site of
the attention module and the BERT blocks goes through :func:`linear`, which uses a pack when
one matches and :func:`bertattn.attention.gemm.linear` otherwise.

A pack is used only when it cannot change what the call means: a float32 CPU input, no autograd
graph to build, no ``torch.jit`` tracing or ``torch.compile``. A weight changed in place
(``load_state_dict``, an optimizer step, ``mul_``) is packed again at its next use; a module
moved or cast (``.to()``) has new weight tensors without packs (call :func:`prepack` again).
The packs live beside the weights, not in the module: ``state_dict``, ``deepcopy`` and
``torch.save`` see nothing of them, and they go when the weights go.
"""

from __future__ import annotations

import functools
import logging
import warnings
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from . import gemm as _gemm

__all__ = [
    "available",
    "prepack",
    "packed_counts",
    "is_packed",
    "uses_pack",
    "linear",
    "MAX_COUNTS",
]

log = logging.getLogger(__name__)

#: at most this many row counts at once: each one is a full copy of the packed weights
MAX_COUNTS = 16


@dataclass
class _Packs:
    """The packs of one weight, ``rows -> packed weight``, valid while :func:`_state` of the
    weight and the tensors it is made of (``watched``) is ``state``."""

    weight: weakref.ref[Tensor]
    watched: tuple[weakref.ref[Tensor], ...]  # a fused q/k/v weight: q, k and v's weights
    gone: weakref.finalize  # drops this entry when the weight goes
    state: tuple[object, ...]
    by_rows: dict[int, Tensor] = field(default_factory=dict)


#: ``id(weight)`` -> its packs; an entry goes when its weight goes (a WeakKeyDictionary would
#: compare tensors with ``==`` on lookup). While it is empty the no-pack path checks only this.
_PACKS: dict[int, _Packs] = {}


@functools.cache
def available() -> bool:
    """Whether this torch build has MKL's packed GEMM (x86 builds with MKL; not ARM)."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        torch.ops.mkl._mkl_linear  # noqa: B018  (raises when the op is not registered)
        torch.ops.mkl._mkl_reorder_linear_weight  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def _mkl_linear(
    x: Tensor, packed: Tensor, weight: Tensor, bias: Tensor | None, rows: int
) -> Tensor:
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def _pack(weight: Tensor, rows: int) -> Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach().contiguous(), rows)


def _state(weight: Tensor, watched: tuple[weakref.ref[Tensor], ...]) -> tuple[object, ...]:
    """Where ``weight`` lives and the version of it and of each watched tensor: any in-place
    change (``mul_``, ``copy_``, ``load_state_dict``) or new storage changes it."""
    if not watched:  # a plain linear weight: the common case, kept cheap
        return weight.data_ptr(), weight._version
    versions = [weight._version]
    for ref in watched:
        t = ref()
        versions.append(-1 if t is None else t._version)
    return weight.data_ptr(), *versions


def _packs_of(weight: Tensor) -> _Packs | None:
    packs = _PACKS.get(id(weight))
    return packs if packs is not None and packs.weight() is weight else None


def is_packed(weight: Tensor) -> bool:
    """``weight`` has packs (for some row counts): its products go through :func:`linear`."""
    return bool(_PACKS) and _packs_of(weight) is not None


def uses_pack(x: Tensor, weight: Tensor) -> bool:
    """``weight`` has a pack for ``x``'s row count (``x``: ``(..., K)``), so that
    :func:`linear` would use MKL's packed product for it (without autograd or tracing)."""
    if not _PACKS:
        return False
    packs = _packs_of(weight)
    if packs is None or not _packable(weight) or not _packable(x) or not x.shape[-1]:
        return False
    return x.numel() // x.shape[-1] in packs.by_rows


def _drop(key: int) -> None:
    _PACKS.pop(key, None)


def _forget(weight: Tensor, packs: _Packs) -> None:
    packs.gone.detach()
    del _PACKS[id(weight)]


def _packable(t: Tensor) -> bool:
    return t.dtype is torch.float32 and t.is_cpu


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)``, through ``weight``'s pack for ``x``'s row count when it
    has one and using it changes nothing but the speed; otherwise through the library chosen
    for float32 CPU products (:mod:`bertattn.attention.gemm`). ``x``: ``(..., K)``; ``weight``:
    ``(N, K)``; returns ``(..., N)``."""
    if _PACKS:
        packs = _packs_of(weight)
        if packs is not None:
            return _through_pack(x, weight, bias, packs)
    return _gemm.linear(x, weight, bias)


def _through_pack(x: Tensor, weight: Tensor, bias: Tensor | None, packs: _Packs) -> Tensor:
    if not _packable(weight):  # cast or moved in place (.double(), .to(...)): old values
        _forget(weight, packs)
        return _gemm.linear(x, weight, bias)
    shape = x.shape
    rows = x.numel() // shape[-1] if shape and shape[-1] else 0
    packed = packs.by_rows.get(rows)
    if (
        packed is None
        or not _packable(x)
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        or torch._C._get_tracing_state()
        or torch.compiler.is_compiling()
    ):
        return _gemm.linear(x, weight, bias)
    state = _state(weight, packs.watched)
    if state != packs.state:  # changed in place since it was packed
        log.debug("a packed weight %s changed: packing it again", tuple(weight.shape))
        packs.by_rows = {r: _pack(weight, r) for r in packs.by_rows}
        packs.state = state
        packed = packs.by_rows[rows]
    return _mkl_linear(x, packed, weight, bias, rows)


def _gemm_weights(module: nn.Module) -> list[tuple[Tensor, tuple[Tensor, ...]]]:
    """The weights ``module``'s forward hands to :func:`linear`, each with the tensors it is
    made of: every attention module's fused q/k/v weight (made of q, k and v's weights, which
    share its storage but not its version counter) and every other ``nn.Linear``'s weight."""
    from .module import MultiHeadAttention  # module.py imports this file

    weights: list[tuple[Tensor, tuple[Tensor, ...]]] = []
    inside_attention: set[int] = set()
    for mod in module.modules():
        if isinstance(mod, MultiHeadAttention):
            lins = mod._qkv_linears()
            with torch.no_grad():
                weights.append((mod.qkv_weight()[0], tuple(lin.weight for lin in lins)))
            inside_attention.update(id(lin) for lin in lins)
    for mod in module.modules():
        if isinstance(mod, nn.Linear) and id(mod) not in inside_attention:
            weights.append((mod.weight, ()))
    return weights


def _counts(token_counts: Iterable[int]) -> tuple[int, ...]:
    try:
        counts = tuple(dict.fromkeys(token_counts))
    except TypeError:
        raise ValueError(
            f"token_counts must be an iterable of row counts (ints >= 1), got "
            f"{type(token_counts).__name__}; e.g. prepack([9]) for one 9-token query."
        ) from None
    bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if bad:
        raise ValueError(
            f"token_counts must be ints >= 1 (rows per GEMM: batch x tokens, or the real tokens "
            f"of a packed batch), got {bad[0]!r}."
        )
    if len(counts) > MAX_COUNTS:
        raise ValueError(
            f"{len(counts)} token counts asked for; each one keeps a full copy of the weights, "
            f"so at most {MAX_COUNTS} are allowed. Pack the counts your inputs really have (pad "
            f"queries to a few fixed lengths if they vary)."
        )
    return counts


def prepack(module: nn.Module, token_counts: Iterable[int]) -> int:
    """Pack ``module``'s GEMM weights for each row count in ``token_counts`` (replacing any
    packs it had); an empty ``token_counts`` drops them. Returns the bytes the packs hold.

    A row count is what each linear layer sees in one call: batch x sequence length for a padded
    batch, the real tokens for a packed (varlen) one. Raises ``ValueError`` for counts that are
    not ints >= 1, more than :data:`MAX_COUNTS` of them, or weights that are not float32 on the
    CPU; warns and packs nothing when this torch build has no MKL packed GEMM.
    """
    counts = _counts(token_counts)
    weights = _gemm_weights(module)
    for w, _ in weights:
        packs = _packs_of(w)
        if packs is not None:
            _forget(w, packs)
    if not counts:
        return 0
    wrong = next((w for w, _ in weights if not _packable(w)), None)
    if wrong is not None:
        raise ValueError(
            f"prepack packs float32 weights on the CPU (MKL's packed GEMM); this module has "
            f"{str(wrong.dtype).removeprefix('torch.')} weights on {wrong.device.type}. Pack "
            f"before moving or casting the model, or leave it unpacked."
        )
    if any(w.is_inference() for w, _ in weights):
        raise ValueError(
            "prepack cannot watch weights made under torch.inference_mode() (inference tensors "
            "have no version counter, so an in-place change would leave a stale pack); load the "
            "model outside inference_mode and use inference_mode only around the calls."
        )
    if not available():
        warnings.warn(
            "this torch build has no MKL packed GEMM (torch.ops.mkl._mkl_linear); prepack does "
            "nothing and linear layers run as usual.",
            RuntimeWarning,
            stacklevel=2,
        )
        return 0
    held = 0
    with torch.no_grad():
        for w, parts in weights:
            watched = tuple(weakref.ref(t) for t in parts)
            gone = weakref.finalize(w, _drop, id(w))
            by_rows = {r: _pack(w, r) for r in counts}
            _PACKS[id(w)] = _Packs(weakref.ref(w), watched, gone, _state(w, watched), by_rows)
            held += w.numel() * w.element_size() * len(counts)
    log.info(
        "packed %d GEMM weights for token counts %s: about %.1f MiB more memory",
        len(weights),
        list(counts),
        held / 2**20,
    )
    return held


def packed_counts(module: nn.Module) -> Sequence[int]:
    """The row counts ``module``'s GEMM weights are packed for (empty when none)."""
    counts: dict[int, None] = {}
    for w, _ in _gemm_weights(module):
        packs = _packs_of(w)
        if packs is not None and _packable(w):  # a cast weight's packs are of no use
            counts.update(dict.fromkeys(packs.by_rows))
    return tuple(counts)
