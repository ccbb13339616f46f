"""Padded-batch benchmark: a whole BERT-base-sized BertModel (random weights) on B=32 sequences
with lengths uniform in [16, 512] (seeded): bertattn varlen vs bertattn sdpa on the padded
batch vs Hugging Face ``BertModel`` (sdpa), fp32 and bf16, same weights."""

from __future__ import annotations

import torch

from bertattn import BertModel
from bertattn.bench import interleaved_medians


def _models(tmp: str, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    from transformers import BertConfig as HFConfig
    from transformers import BertModel as HFBertModel

    torch.manual_seed(0)
    config = HFConfig()  # BERT-base sizes
    config._attn_implementation = "sdpa"
    hf = HFBertModel(config).eval()
    hf.save_pretrained(tmp)
    hf = hf.to(dtype)
    varlen = BertModel.from_pretrained(tmp, dtype=dtype, backend="varlen").eval()
    sdpa = BertModel.from_pretrained(tmp, dtype=dtype, backend="sdpa").eval()
    return hf, varlen, sdpa


def native_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (else bf16 is emulated, ~8x slower)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def run_padded_bench(batch: int = 32, repeats: int = 5, dtypes=None) -> list[dict[str, object]]:
    """Each call takes tens of seconds on 2 cores, so rounds start without a warm-up call;
    bf16 runs only where the CPU has native bf16 (elsewhere it would take an hour)."""
    import tempfile

    if dtypes is None:
        dtypes = (torch.float32, torch.bfloat16) if native_bf16() else (torch.float32,)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 513, (batch,), generator=gen)
    seq = int(lengths.max())
    ids = torch.randint(1000, 30000, (batch, seq), generator=gen)
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    real = mask.bool()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in dtypes:
            hf, varlen, sdpa = _models(tmp, dtype)
            fns = {
                "bertattn varlen": lambda m=varlen: m(ids, mask),
                "bertattn sdpa (padded)": lambda m=sdpa: m(ids, mask),
                "transformers sdpa": lambda m=hf: m(input_ids=ids, attention_mask=mask),
            }
            with torch.inference_mode():
                ref = fns["transformers sdpa"]().last_hidden_state[real].float()
                diffs = {
                    n: (f().last_hidden_state[real].float() - ref).abs().max().item()
                    for n, f in fns.items()
                }
                timer = interleaved_medians(fns, repeats=repeats, warmup=0)
            base = timer.median("transformers sdpa")
            results.append(
                {
                    "dtype": str(dtype).replace("torch.", ""),
                    "batch": batch,
                    "real_tokens": int(lengths.sum()),
                    "padded_tokens": batch * seq,
                    "seconds": {n: timer.median(n) for n in fns},
                    "speedup_vs_transformers": {n: base / timer.median(n) for n in fns},
                    "max_abs_diff_vs_transformers_on_real_tokens": diffs,
                }
            )
    return results


def format_padded_table(results: list[dict[str, object]]) -> str:
    r0 = results[0]
    lines = [
        f"BERT-base, B={r0['batch']}, lengths U[16, 512]: {r0['real_tokens']} real of "
        f"{r0['padded_tokens']} padded tokens",
        f"{'dtype':<10}{'peer':<26}{'median s':>10}{'vs HF':>8}{'max|diff|':>11}",
    ]
    for r in results:
        for n, sec in r["seconds"].items():  # type: ignore[attr-defined]
            lines.append(
                f"{r['dtype']:<10}{n:<26}{sec:>10.2f}"
                f"{r['speedup_vs_transformers'][n]:>7.2f}x"  # type: ignore[index]
                f"{r['max_abs_diff_vs_transformers_on_real_tokens'][n]:>11.1e}"  # type: ignore[index]
            )
    return "\n".join(lines)
