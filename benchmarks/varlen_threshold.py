"""Where packing starts to pay on this CPU: MiniLM (the default model), B=32 sequences of
length ~128 with a growing share of padding, bertattn varlen vs sdpa on the padded batch.

    python -m benchmarks.varlen_threshold
"""

from __future__ import annotations

import torch

from bertattn import BertModel
from bertattn.bench import interleaved_medians
from bertattn.encoder.pipeline import default_model_dir


def run_threshold_bench(repeats: int = 5) -> list[dict[str, float]]:
    folder = default_model_dir()
    models = {be: BertModel.from_pretrained(folder, backend=be) for be in ("varlen", "sdpa")}
    gen = torch.Generator().manual_seed(0)
    rows = []
    for target in (0.0, 0.025, 0.05, 0.1, 0.2, 0.4):
        b, length = 32, 128
        # lengths so that about `target` of the padded batch is padding, longest = 128
        short = int(round(length * (1 - 2 * target))) if target else length
        lengths = torch.linspace(short, length, b).round().long()
        ids = torch.randint(1000, 20000, (b, length), generator=gen)
        mask = (torch.arange(length)[None] < lengths[:, None]).long()
        fns = {be: (lambda m=m, i=ids, k=mask: m(i, k)) for be, m in models.items()}
        with torch.inference_mode():
            t = interleaved_medians(fns, repeats=repeats, warmup=1)
        pad = 1 - float(lengths.sum()) / (b * length)
        rows.append(
            {
                "pad_fraction": pad,
                "varlen_s": t.median("varlen"),
                "sdpa_s": t.median("sdpa"),
                "varlen_speedup": t.median("sdpa") / t.median("varlen"),
            }
        )
    return rows


def format_threshold_table(rows: list[dict[str, float]]) -> str:
    lines = ["MiniLM, B=32, L=128: varlen vs sdpa on the padded batch (fp32)"]
    lines.append(f"{'padding':>8}{'varlen ms':>11}{'sdpa ms':>9}{'varlen x':>10}")
    for r in rows:
        lines.append(
            f"{r['pad_fraction']:>8.1%}{r['varlen_s'] * 1e3:>11.1f}{r['sdpa_s'] * 1e3:>9.1f}"
            f"{r['varlen_speedup']:>9.2f}x"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_threshold_table(run_threshold_bench()))
