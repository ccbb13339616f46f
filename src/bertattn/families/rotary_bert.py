"""The post-norm rotary BERT that GTE, NomicBERT and Jina v3 share, read top to bottom: config,
embeddings, layer, encoder, name map. Each of those families is a :class:`Variant` of it (in
its own file, with its record).

Against BERT:

* no position table: every layer rotates its queries and keys (one base, ``rope_parameters``'
  ``rope_theta``; only the ``default`` rope type);
* BERT's post-LayerNorm block around it (``norm(x + attn(x))``, ``norm(h + mlp(h))``), under
  transformers' names ``layers.N.self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``,
  ``mlp``, ``post_mlp_layernorm``;
* the feed-forward: plain (Jina v3: ``fc1``, ``fc2``) or gated (GTE, NomicBERT:
  ``act(gate_proj(x)) * up_proj(x)`` then ``down_proj``);
* token types: one row (given to both segments of a pair, as for RoBERTa), two, or none (GTE's
  ``type_vocab_size: 0``: nothing added).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..blocks import (
    EncoderBlock,
    FeedForward,
    GatedFeedForward,
    LayerKind,
    RotaryEncoder,
    TokenEmbeddings,
    make_norm,
)
from ..blocks.rotary import NtkScaling
from ..errors import ModelFolderError
from .config_fields import known_activation
from .registry import Family
from .rope import Refuse, even_head_size, rope_object, rope_theta, rotary_attention

__all__ = ["RotaryArch", "Variant", "embeddings", "family"]


# ---------------------------------------------------------------------- config
@dataclass(frozen=True)
class Variant:
    """What one family changes: its name, the base model's prefix in task checkpoints, the
    base and activation transformers uses when the config has none, and where it is not a
    gated feed-forward without biases, the feed-forward (``gated``) and the biases."""

    name: str
    title: str
    prefix: str
    default_theta: float
    default_act: str
    #: a gated feed-forward (``act(gate) * up``, then down); False: BERT's two linears
    gated: bool = True
    #: biases on the attention's projections, the feed-forward's first linear(s), its last
    attention_bias: bool = False
    mlp_in_bias: bool = False
    mlp_out_bias: bool = False
    #: the checkpoint's layer names -> the canonical ones :func:`key_map` reads, in order
    #: (``re.sub`` patterns on a name without its prefix); the fused ``self_attn.qkv`` and
    #: ``mlp.up_gate`` (up first, as GTE stores it) are split by :func:`rename`
    renames: tuple[tuple[str, str], ...] = ()
    #: other prefixes the base model has in task checkpoints, read as ``prefix`` (GTE's own
    #: ``new.``, where transformers writes ``gte.``)
    other_prefixes: tuple[str, ...] = ()
    #: remote-code settings bertattn runs one way only: ``(field, value)``, a config.json
    #: naming the field with another value is refused (GTE's ``layer_norm_type``)
    fixed: tuple[tuple[str, object], ...] = ()
    #: ``model_type`` -> rotary base when the config has none, where an alias's remote code
    #: has another default than :attr:`default_theta` (GTE's ``new``: 10,000)
    alias_theta: tuple[tuple[str, float], ...] = ()
    #: the config under transformers' field names, for a family whose remote code names
    #: them otherwise (NomicBERT's ``n_embd``, ...): ``translate(data, refuse)``
    translate: Callable[[dict[str, Any], Refuse], dict[str, Any]] | None = None
    #: whether ``rope_scaling`` of type ``ntk`` is computed (GTE's remote code has it);
    #: otherwise any ``rope_scaling`` is refused
    ntk: bool = False


@dataclass(frozen=True)
class RotaryArch:
    """The settings beyond BERT's sizes."""

    variant: Variant
    theta: float
    #: rows of the checkpoint's token-type table (0: none)
    type_rows: int
    #: the rotation's NTK scaling (``rope_scaling`` of type ``ntk``), None: none
    ntk: NtkScaling | None = None


def read_config(variant: Variant, data: dict[str, Any], source: str) -> tuple[dict, RotaryArch]:
    """``config.json`` -> BERT's sizes and :class:`RotaryArch`; what bertattn does not
    reproduce is refused naming the field."""

    def refuse(field: str, value: object, expected: str) -> ModelFolderError:
        return ModelFolderError(
            f"{source}: {field}={value!r} is not supported; bertattn loads {variant.title} "
            f"checkpoints with {expected}."
        )

    if variant.translate is not None:
        data = variant.translate(data, refuse)
    for field_name, value in variant.fixed:
        if field_name in data and data[field_name] != value:
            raise refuse(field_name, data[field_name], f"{field_name}={value!r}")
    ntk = read_ntk(data.get("rope_scaling"), refuse) if variant.ntk else None
    if not variant.ntk and data.get("rope_scaling") is not None:
        raise refuse("rope_scaling", data["rope_scaling"], "rope_scaling null")
    params = rope_object(data.get("rope_parameters"), "rope_parameters", refuse,
                         "a dict with rope_type and rope_theta")  # fmt: skip
    if params.get("rope_type", "default") != "default":
        raise refuse("rope_parameters.rope_type", params["rope_type"], "'default'")
    if "rope_theta" in params:
        theta = rope_theta(params["rope_theta"], "rope_parameters.rope_theta", refuse)
    elif data.get("rope_theta") is not None:
        theta = rope_theta(data["rope_theta"], "rope_theta", refuse)
    else:
        theta = dict(variant.alias_theta).get(data.get("model_type"), variant.default_theta)
    hidden, heads = data.get("hidden_size", 768), data.get("num_attention_heads", 12)
    even_head_size(hidden, heads, refuse)
    head_dim = data.get("head_dim")
    if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        if head_dim != hidden // heads:
            raise refuse("head_dim", head_dim, "head_dim = hidden_size / num_attention_heads")
    act = known_activation(data, "hidden_act", variant.default_act, source)
    rows = data.get("type_vocab_size", 2)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise refuse("type_vocab_size", rows, "an int >= 0")
    sizes = {
        k: v for k, v in data.items()
        if k not in ("embedding_size", "relative_attention_num_buckets", "position_embedding_type")
    }  # fmt: skip
    sizes.update(model_type="bert", hidden_act=act, type_vocab_size=max(rows, 2))
    return sizes, RotaryArch(variant, float(theta), rows, ntk)


def _positive_number(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and value > 0
    )


def read_ntk(scaling: object, refuse: Refuse) -> NtkScaling | None:
    """``rope_scaling`` (GTE's remote code: ``{"type": "ntk", "factor": s}``, ``mixed_b``
    optional) as an :class:`NtkScaling`; null is none, any other type or value is refused."""
    if scaling is None:
        return None
    expected = 'rope_scaling null or {"type": "ntk", "factor": a number >= 1}'
    if not isinstance(scaling, dict) or scaling.get("type", scaling.get("rope_type")) != "ntk":
        raise refuse("rope_scaling", scaling, expected)
    factor, mixed_b = scaling.get("factor"), scaling.get("mixed_b")
    if not _positive_number(factor) or factor < 1:  # type: ignore[operator]
        raise refuse("rope_scaling.factor", factor, "a finite number >= 1 (e.g. 2.0)")
    if mixed_b is not None and not _positive_number(mixed_b):
        raise refuse("rope_scaling.mixed_b", mixed_b, "null or a finite number > 0 (e.g. 0.625)")
    return NtkScaling(float(factor), None if mixed_b is None else float(mixed_b))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- embeddings
def embeddings(config: Any) -> TokenEmbeddings:
    """Word (+ token type) embeddings, LayerNorm and dropout: no positions (the layers
    rotate)."""
    arch: RotaryArch = config.arch
    norm = make_norm(config.hidden_size, config.layer_norm_eps)
    types = config.type_vocab_size if arch.type_rows else 0
    return TokenEmbeddings(config.vocab_size, config.hidden_size, norm,
                           padding_idx=config.pad_token_id, token_types=types,
                           dropout=config.hidden_dropout_prob)  # fmt: skip


# ---------------------------------------------------------------------- layer
def _layer(config: Any, backend: str) -> EncoderBlock:
    arch: RotaryArch = config.arch
    v, e, inner = arch.variant, config.hidden_size, config.intermediate_size
    attn = rotary_attention(config, backend, arch.theta, bias=v.attention_bias)
    mlp: nn.Module
    if v.gated:
        mlp = GatedFeedForward(
            e, inner, config.hidden_act, bias_in=v.mlp_in_bias, bias_out=v.mlp_out_bias
        )
    else:
        mlp = FeedForward(e, inner, config.hidden_act, bias=v.mlp_out_bias)
    attn_norm = make_norm(e, config.layer_norm_eps)
    mlp_norm = make_norm(e, config.layer_norm_eps)
    return EncoderBlock(
        attn, mlp, attn_norm, mlp_norm, prenorm=False, dropout=config.hidden_dropout_prob
    )


# ---------------------------------------------------------------------- encoder
def build(config: Any, backend: str, pooler: bool) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """Embeddings, the post-norm rotary layers (no final norm) and, when the checkpoint has
    one, BERT's pooler (dense + tanh on the first token)."""
    from .bert_layers import BertPooler

    arch: RotaryArch = config.arch
    n = config.num_hidden_layers
    kinds = [LayerKind(arch.theta, ntk=arch.ntk)] * n
    layers = [_layer(config, backend) for _ in range(n)]
    head = BertPooler(config) if pooler else None
    return embeddings(config), RotaryEncoder(layers, kinds, None), head


# ---------------------------------------------------------------------- names
def _canonical(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    for pattern, repl in renames:
        name = re.sub(pattern, repl, name)
    return name


def rename(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """The checkpoint's tensors (as the family's hub folders and transformers' ``save_pretrained``
    name them) under the canonical names of :func:`key_map`: the variant's renames, the fused
    ``qkv`` split into the article's three projections, a gated feed-forward's up and gate
    projections joined into one ``(2I, E)`` input projection with the activated half (the gate)
    first, and a one-row token-type table given to both segments of a pair."""
    arch: RotaryArch = config.arch
    v = arch.variant
    out: dict[str, Tensor] = {}
    halves: dict[str, dict[str, Tensor]] = {}  # "layers.N.mlp.gate_up.weight" -> up / gate
    for key, tensor in state.items():
        for other in v.other_prefixes:
            if key.startswith(other):
                key = v.prefix + key[len(other) :]
        top = v.prefix if key.startswith(v.prefix) else ""
        name = _canonical(key[len(top) :], v.renames)
        if ".self_attn.qkv." in name:
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3), strict=True):
                out[top + name.replace(".qkv.", f".{part}.")] = piece
            continue
        if ".mlp.up_gate." in name:  # GTE: up first, gate second
            up, gate = tensor.chunk(2)
            halves[top + name.replace(".up_gate.", ".gate_up.")] = {"up": up, "gate": gate}
            continue
        glu = re.search(r"\.mlp\.(up|gate)_proj\.", name)
        if glu is not None and v.gated:
            joined = top + name.replace(f".{glu.group(1)}_proj.", ".gate_up.")
            halves.setdefault(joined, {})[glu.group(1)] = tensor
            continue
        if name.endswith("embeddings.token_type_embeddings.weight") and tensor.shape[0] == 1:
            tensor = tensor.expand(2, -1).clone()
        out[top + name] = tensor
    for name, parts in halves.items():
        if set(parts) != {"up", "gate"}:
            have = ", ".join(sorted(parts))
            raise ModelFolderError(f"{name}: the checkpoint has the {have} projection only.")
        out[name] = torch.cat([parts["gate"], parts["up"]], dim=0)  # (2I, E): activated first
    return out


#: the attention's four projections: the checkpoint's name -> bertattn's
_PROJECTIONS = (("q_proj", "q_linear"), ("k_proj", "k_linear"), ("v_proj", "v_linear"),
                ("o_proj", "out_linear"))  # fmt: skip


def attention_keys(theirs: str, ours: str, params: list[str]) -> dict[str, str]:
    """One layer's attention projections, ``{theirs}self_attn.q_proj.<p>`` ->
    ``{ours}attn.q_linear.<p>`` (and k, v, o) for each ``p`` of ``params`` (``weight``, and
    ``bias`` where the projections have one)."""
    return {
        f"{theirs}self_attn.{a}.{p}": f"{ours}attn.{b}.{p}" for a, b in _PROJECTIONS for p in params
    }


def key_map(config: Any, pooler: bool = True) -> dict[str, str]:
    """The family's names (after :func:`rename`, without its prefix) -> bertattn's."""
    arch: RotaryArch = config.arch
    v = arch.variant
    both = ["weight", "bias"]
    keys = {"embeddings.word_embeddings.weight": "embeddings.word.weight"}
    if arch.type_rows:
        keys["embeddings.token_type_embeddings.weight"] = "embeddings.token_type.weight"
    keys.update({f"embeddings.LayerNorm.{p}": f"embeddings.norm.{p}" for p in both})
    attn = both if v.attention_bias else ["weight"]
    if v.gated:
        mlp = [("gate_up", "w_in", v.mlp_in_bias), ("down_proj", "w_out", v.mlp_out_bias)]
    else:
        mlp = [("fc1", "fc_in", v.mlp_out_bias), ("fc2", "fc_out", v.mlp_out_bias)]
    for i in range(config.num_hidden_layers):
        theirs, ours = f"layers.{i}.", f"encoder.layers.{i}."
        keys.update(attention_keys(theirs, ours, attn))
        for a, b, bias in mlp:
            for p in both if bias else ["weight"]:
                keys[f"{theirs}mlp.{a}.{p}"] = f"{ours}mlp.{b}.{p}"
        for a, b in (("post_attention_layernorm", "attn_norm"), ("post_mlp_layernorm", "mlp_norm")):
            for p in both:
                keys[f"{theirs}{a}.{p}"] = f"{ours}{b}.{p}"
    if pooler:
        keys.update({f"pooler.dense.{p}": f"pooler.dense.{p}" for p in both})
    return keys


def family(variant: Variant, heads: tuple[str, ...], **record: Any) -> Family:
    """The registry record of ``variant`` (``record``: more of :class:`Family`'s fields)."""
    return Family(
        variant.name,
        variant.title,
        lambda data, source: read_config(variant, data, source),
        rename,
        key_map,
        build,
        prefix=variant.prefix,
        other_prefixes=variant.other_prefixes,
        head_prefixes=heads,
        capabilities=frozenset({"onnx", "token_types", "int8"}),
        missing={
            "steps": f"{variant.title}'s rotary positions",
            "cuda_graphs": f"{variant.title}'s encoder",
        },
        **record,
    )
