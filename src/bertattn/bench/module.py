"""Module-level benchmark: bertattn's MultiHeadAttention against the peers a user would try.

Peers, all with the same weights, eval mode, no weights returned where that is optional:

* ``article``: the article's class (``bertattn.bench.article``), as printed;
* ``torch_mha``: ``torch.nn.MultiheadAttention`` on its fast path (``need_weights=False``);
* ``hf_sdpa``: Hugging Face ``BertSelfAttention`` (sdpa) followed by ``BertSelfOutput.dense``
  (only when ``transformers`` is installed).

Each case also times the same-dtype GEMM of the QKV projection shape, the machine's practical
limit, and reports each peer's achieved GFLOP/s and its share of that rate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..attention import MultiHeadAttention
from .article import ArticleMultiHeadAttention
from .timing import interleaved_medians

log = logging.getLogger(__name__)

#: (batch, seq_len, dtype) of the cases of issue 5 (E=768, H=12).
DEFAULT_CASES: list[tuple[int, int, torch.dtype]] = [
    (8, 128, torch.float32),
    (8, 512, torch.float32),
    (8, 128, torch.bfloat16),
    (8, 512, torch.bfloat16),
    (1, 2048, torch.float32),
    (1, 2048, torch.bfloat16),
]


@dataclass
class ModuleResult:
    batch: int
    seq_len: int
    dtype: str
    gflop: float
    gemm_gflops: float
    seconds: dict[str, float]
    gflops: dict[str, float]
    share_of_gemm: dict[str, float]
    speedup_vs: dict[str, float]
    max_abs_diff_vs_fp32_math: dict[str, float]


def attention_flops(batch: int, seq_len: int, embed_dim: int) -> float:
    """FLOPs of one self-attention forward: 4 projections + QK^T + AV (2 per multiply-add)."""
    projections = 2 * batch * seq_len * embed_dim * embed_dim * 4
    scores_and_context = 2 * 2 * batch * seq_len * seq_len * embed_dim
    return float(projections + scores_and_context)


def _torch_peer(m: MultiHeadAttention) -> nn.MultiheadAttention:
    e, h = m.embed_dim, m.num_heads
    t = nn.MultiheadAttention(e, h, dropout=0.0, batch_first=True)
    w, b = m.qkv_weight()
    with torch.no_grad():
        t.in_proj_weight.copy_(w)
        t.in_proj_bias.copy_(b)
        t.out_proj.weight.copy_(m.out_linear.weight)
        t.out_proj.bias.copy_(m.out_linear.bias)
    return t.eval()


def _hf_peer(m: MultiHeadAttention) -> Callable[[torch.Tensor], torch.Tensor] | None:
    try:
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertSelfAttention
    except ImportError:
        log.warning("transformers is not installed: the hf_sdpa peer is skipped")
        return None
    cfg = BertConfig(
        hidden_size=m.embed_dim, num_attention_heads=m.num_heads, attention_probs_dropout_prob=0.0
    )
    cfg._attn_implementation = "sdpa"
    attn = BertSelfAttention(cfg).eval()
    dense = nn.Linear(m.embed_dim, m.embed_dim).eval()
    with torch.no_grad():
        for mine, theirs in [
            (m.q_linear, attn.query),
            (m.k_linear, attn.key),
            (m.v_linear, attn.value),
            (m.out_linear, dense),
        ]:
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)

    def run(x: torch.Tensor) -> torch.Tensor:
        return dense(attn(x)[0])

    run.modules = (attn, dense)  # type: ignore[attr-defined]
    return run


def run_case(
    batch: int,
    seq_len: int,
    dtype: torch.dtype,
    *,
    embed_dim: int = 768,
    num_heads: int = 12,
    repeats: int = 5,
    seed: int = 0,
) -> ModuleResult:
    """Time one case; every peer gets the same weights and the same input."""
    torch.manual_seed(seed)
    ours = MultiHeadAttention(embed_dim, num_heads, dropout=0.0).eval()
    article = ArticleMultiHeadAttention(embed_dim, num_heads, dropout=0.0).eval()
    article.load_state_dict(ours.state_dict())
    x32 = torch.randn(batch, seq_len, embed_dim)
    with torch.no_grad():
        ref_math = MultiHeadAttention(embed_dim, num_heads, 0.0, backend="math").eval()
        ref_math.load_state_dict(ours.state_dict())
        reference = ref_math(x32)[0]  # the fp32 math reference
    torch_mha = _torch_peer(ours)
    hf = _hf_peer(ours)
    for mod in [ours, article, torch_mha, *(getattr(hf, "modules", ()))]:
        mod.to(dtype)
    x = x32.to(dtype)
    w_gemm = torch.randn(3 * embed_dim, embed_dim, dtype=dtype)
    x_gemm = x.reshape(-1, embed_dim)

    fns: dict[str, Callable[[], object]] = {
        "bertattn": lambda: ours(x, need_weights=False),
        "article": lambda: article(x),
        "torch_mha": lambda: torch_mha(x, x, x, need_weights=False),
        "gemm": lambda: torch.mm(x_gemm, w_gemm.t()),
    }
    if hf is not None:
        fns["hf_sdpa"] = lambda: hf(x)
    with torch.inference_mode():
        outs = {name: fn() for name, fn in fns.items() if name != "gemm"}
        timer = interleaved_medians(fns, repeats=repeats)
    flops = attention_flops(batch, seq_len, embed_dim)
    gemm_flops = 2.0 * x_gemm.shape[0] * embed_dim * 3 * embed_dim
    seconds = {n: timer.median(n) for n in fns}
    gemm_rate = gemm_flops / seconds["gemm"] / 1e9
    peers = [n for n in fns if n != "gemm"]
    gflops = {n: flops / seconds[n] / 1e9 for n in peers}
    diffs = {}
    for name, out in outs.items():
        tensor = out[0] if isinstance(out, tuple) else out
        diffs[name] = (tensor.float() - reference).abs().max().item()
    return ModuleResult(
        batch=batch,
        seq_len=seq_len,
        dtype=str(dtype).replace("torch.", ""),
        gflop=flops / 1e9,
        gemm_gflops=gemm_rate,
        seconds=seconds,
        gflops=gflops,
        share_of_gemm={n: gflops[n] / gemm_rate for n in peers},
        speedup_vs={n: seconds[n] / seconds["bertattn"] for n in peers if n != "bertattn"},
        max_abs_diff_vs_fp32_math=diffs,
    )


def run_module_bench(
    cases: list[tuple[int, int, torch.dtype]] | None = None,
    *,
    repeats: int = 5,
    progress: Callable[[str], object] | None = None,
) -> list[dict[str, object]]:
    """All cases, as JSON-ready dicts; ``progress`` is told each case as it starts."""
    chosen = cases or DEFAULT_CASES
    out = []
    for i, (b, length, dt) in enumerate(chosen):
        if progress is not None:
            name = str(dt).replace("torch.", "")
            progress(f"case {i + 1}/{len(chosen)}: B={b} L={length} {name}")
        out.append(asdict(run_case(b, length, dt, repeats=repeats)))
    return out


def format_module_table(results: list[dict[str, object]]) -> str:
    """A plain-text table: medians, GFLOP/s, share of GEMM, bertattn's speedup over each peer."""
    lines = [
        f"{'case':<22}{'peer':<11}{'median ms':>10}{'GFLOP/s':>9}{'% GEMM':>8}"
        f"{'bertattn x':>11}{'max|diff|':>11}"
    ]
    for r in results:
        case = f"B={r['batch']} L={r['seq_len']} {r['dtype']}"
        seconds: dict[str, float] = r["seconds"]  # type: ignore[assignment]
        for peer, sec in seconds.items():
            if peer == "gemm":
                continue
            speed = r["speedup_vs"].get(peer)  # type: ignore[attr-defined]
            lines.append(
                f"{case:<22}{peer:<11}{sec * 1e3:>10.2f}{r['gflops'][peer]:>9.1f}"  # type: ignore[index]
                f"{100 * r['share_of_gemm'][peer]:>7.0f}%"  # type: ignore[index]
                f"{'' if speed is None else f'{speed:.2f}x':>11}"
                f"{r['max_abs_diff_vs_fp32_math'][peer]:>11.1e}"  # type: ignore[index]
            )
            case = ""
        lines.append(f"{'':<22}{'gemm':<11}{seconds['gemm'] * 1e3:>10.2f}{r['gemm_gflops']:>9.1f}")
    return "\n".join(lines)
