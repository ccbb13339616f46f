"""Peak memory of weights on demand: one 512-token text through the default model (MiniLM,
6 layers x 12 heads), attention weights for no layer / one layer / every layer, each in a fresh
process (peak RSS), plus the bytes of the returned maps.

    python -m benchmarks.weights_on_demand
"""

from __future__ import annotations

import json
import subprocess
import sys

MODES = {"none": False, "one layer": [3], "all layers": True}


def _child(mode: str) -> None:
    import torch

    from bertattn import BertModel
    from bertattn.bench.memory import peak_rss_mib
    from bertattn.encoder.pipeline import default_model_dir

    model = BertModel.from_pretrained(default_model_dir()).eval()
    ids = torch.randint(1000, 20000, (1, 512), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = model(ids, output_attentions=MODES[mode])
    maps = sum(a.numel() * a.element_size() for a in (out.attentions or ()) if a is not None)
    peak = peak_rss_mib()
    print(json.dumps({"mode": mode, "peak_mib": peak, "maps_mib": maps / 2**20}))


def run_weights_bench() -> dict[str, dict[str, float]]:
    out = {}
    for mode in MODES:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.weights_on_demand", mode],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        out[mode] = {"peak_mib": row["peak_mib"], "maps_mib": row["maps_mib"]}
    return out


def format_weights_table(result: dict[str, dict[str, float]]) -> str:
    lines = ["weights on demand, MiniLM, 1 x 512 tokens (peak RSS, fresh process each)"]
    for mode, r in result.items():
        lines.append(f"  {mode:<12}{r['peak_mib']:>8.0f} MiB peak, maps {r['maps_mib']:>6.1f} MiB")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _child(" ".join(sys.argv[1:]))
    else:
        print(format_weights_table(run_weights_bench()))
