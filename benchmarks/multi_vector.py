"""Multi-vector models and bge-m3's three outputs against their reference implementations, in
one run, peers interleaved round by round (medians), CPU fp32, the same threads:

- ``MultiVectorEncoder.encode_document`` vs sentence-transformers 6's ``MultiVectorEncoder``
  on the same folder (all-MiniLM-L6-v2's encoder, a seeded 128-wide Dense, a punctuation
  skip-list, Normalize: the shape of answerai-colbert-small / a ColBERT on MiniLM), on short
  passages (first docstring paragraphs of the standard library) and on 256-token passages
  (whole docstrings, cut at the folder's ``document_length`` 256);
- ``M3Encoder.encode(return_dense, return_sparse, return_colbert_vecs)`` on a bge-m3-shaped
  model (hidden 1024, 16 heads, feed-forward 4096, ``--layers`` layers, default 24: bge-m3's
  XLM-RoBERTa sizes as a BERT with MiniLM's WordPiece vocabulary; random weights and seeded
  ``colbert_linear.pt`` / ``sparse_linear.pt``: the work per token is bge-m3's, the vocabulary
  only sizes the embedding lookup) vs transformers' ``AutoModel`` plus the two linear layers
  with FlagEmbedding's formulas (length-sorted batches; FlagEmbedding itself does not install
  here).

    python -m benchmarks.multi_vector [--short 512] [--long 128] [--m3-texts 32] [--layers 24]
        [--repeats 3] [--threads N] [--cpu-time] [--json FILE]

Prints the CPU, the threads, each peer's texts/s and the ratio (the issue's target: >= 2x).
``--cpu-time`` times each call in this process's CPU seconds instead of wall time (a shared
machine; use it with ``--threads 1``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bertattn.bench import environment, interleaved_medians
from bertattn.encoder.folder import default_model_dir

from .corpus import stdlib_docstring_corpus, stdlib_paragraph_corpus

TARGET = 2.0


def build_colbert(out: Path) -> Path:
    """A sentence-transformers MultiVectorEncoder folder on MiniLM's encoder (see the module
    docstring), saved by sentence-transformers."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    torch.manual_seed(0)
    STMultiVectorEncoder(
        modules=[
            Transformer(str(default_model_dir()), query_length=32, document_length=256),
            Dense(384, 128, bias=False, activation_function=torch.nn.Identity(),
                  module_input_name="token_embeddings"),
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ],
        device="cpu",
    ).save(str(out))  # fmt: skip
    return out


def build_m3(out: Path, layers: int) -> Path:
    """A random BERT of bge-m3's sizes with MiniLM's tokenizer and seeded linear layers."""
    import transformers

    base = default_model_dir()
    cfg = transformers.BertConfig(
        vocab_size=30522, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
        intermediate_size=4096, max_position_embeddings=514,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(cfg).eval().save_pretrained(out)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (base / name).exists():
            shutil.copy(base / name, out / name)
    g = torch.Generator().manual_seed(1)
    torch.save(
        {"weight": torch.randn(1024, 1024, generator=g) * 0.03, "bias": torch.zeros(1024)},
        out / "colbert_linear.pt",
    )
    torch.save(
        {"weight": torch.randn(1, 1024, generator=g) * 0.03, "bias": torch.zeros(1)},
        out / "sparse_linear.pt",
    )
    return out


class TransformersM3:
    """FlagEmbedding's ``encode`` with the three flags, written out on transformers' model:
    length-sorted batches, dense = normalized [CLS], lexical weights = relu(sparse_linear(h))
    the largest per token id (special tokens left out), ColBERT = normalized
    colbert_linear(h[1:]) of the real tokens."""

    def __init__(self, folder: Path, max_length: int = 512, batch_size: int = 32) -> None:
        import transformers

        self.tok = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = transformers.AutoModel.from_pretrained(folder).eval()
        self.colbert = torch.nn.Linear(1024, 1024)
        self.colbert.load_state_dict(torch.load(folder / "colbert_linear.pt", weights_only=True))
        self.sparse = torch.nn.Linear(1024, 1)
        self.sparse.load_state_dict(torch.load(folder / "sparse_linear.pt", weights_only=True))
        self.max_length, self.batch_size = max_length, batch_size
        t = self.tok
        self.unused = {t.cls_token_id, t.sep_token_id, t.pad_token_id, t.unk_token_id}

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> dict[str, object]:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        dense, lexical, colbert = [None] * len(texts), [None] * len(texts), [None] * len(texts)
        for s in range(0, len(order), self.batch_size):
            idx = order[s : s + self.batch_size]
            enc = self.tok(
                [texts[i] for i in idx], padding=True, truncation=True,
                max_length=self.max_length, return_tensors="pt",
            )  # fmt: skip
            h = self.model(**enc).last_hidden_state  # (B, L, E)
            d = torch.nn.functional.normalize(h[:, 0], dim=-1)
            w = torch.relu(self.sparse(h)).squeeze(-1)  # (B, L)
            c = self.colbert(h[:, 1:]) * enc["attention_mask"][:, 1:, None]
            c = torch.nn.functional.normalize(c, dim=-1)
            for j, i in enumerate(idx):
                dense[i] = d[j].numpy()
                weights: dict[str, float] = {}
                for tid, wt in zip(enc["input_ids"][j].tolist(), w[j].tolist(), strict=True):
                    if tid not in self.unused and wt > 0 and wt > weights.get(str(tid), 0):
                        weights[str(tid)] = wt
                lexical[i] = weights  # type: ignore[call-overload]
                n = int(enc["attention_mask"][j].sum())
                colbert[i] = c[j, : n - 1].numpy()
        return {"dense_vecs": np.stack(dense), "lexical_weights": lexical, "colbert_vecs": colbert}  # type: ignore[arg-type]


def _race(  # type: ignore[no-untyped-def]
    ours, theirs, n: int, repeats: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    timer = interleaved_medians(
        {"bertattn": ours, "reference": theirs}, repeats=repeats, clock=clock
    )
    mine, base = timer.median("bertattn"), timer.median("reference")
    return {
        "texts": n, "bertattn_s": mine, "reference_s": base, "bertattn_per_s": n / mine,
        "reference_per_s": n / base, "ratio": base / mine,
    }  # fmt: skip


def run(
    short: int,
    long: int,
    m3_texts: int,
    layers: int,
    repeats: int,
    threads: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    from bertattn import M3Encoder, MultiVectorEncoder

    out: dict[str, object] = {"environment": environment(), "layers": layers}
    out["clock"] = "CPU" if clock is time.process_time else "wall"
    shorts = stdlib_docstring_corpus(short)
    longs = stdlib_paragraph_corpus(long)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_colbert(Path(tmp) / "colbert")
        ours = MultiVectorEncoder(folder, threads=threads)
        theirs = STMultiVectorEncoder(str(folder), device="cpu")
        a, b = ours.encode_document(shorts[:64]), theirs.encode_document(shorts[:64])
        diffs = [float((x - y).abs().max()) for x, y in zip(a, b, strict=True)]
        out["colbert_max_abs_diff"] = max(diffs)
        tokens = [len(x) for x in ours.encode_document(longs)]
        out["long_tokens_median"] = float(np.median(tokens))
        for name, texts in (("short", shorts), ("256-token", longs)):
            out[f"colbert {name}"] = _race(
                lambda t=texts: ours.encode_document(t, batch_size=32),
                lambda t=texts: theirs.encode_document(t, batch_size=32),
                len(texts), repeats, clock,
            )  # fmt: skip
        m3_folder = build_m3(Path(tmp) / "m3", layers)
        m3 = M3Encoder(m3_folder, threads=threads, batch_size=32)
        ref = TransformersM3(m3_folder)
        texts = longs[:m3_texts]
        flags = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
        got, want = m3.encode(texts, **flags), ref.encode(texts)
        out["m3_max_abs_diff"] = float(np.abs(got["dense_vecs"] - want["dense_vecs"]).max())
        out["m3 256-token"] = _race(
            lambda: m3.encode(texts, **flags), lambda: ref.encode(texts), len(texts), repeats, clock
        )
    return out


def table(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"{env['processor']} ({env['cpu_capability']}), {env['threads']} threads, torch "
        f"{env['torch']}, fp32, {result.get('clock', 'wall')} time; max |diff| ColBERT rows "
        f"{result['colbert_max_abs_diff']:.1e}, "
        f"bge-m3 dense {result['m3_max_abs_diff']:.1e}; 256-token passages: median "
        f"{result['long_tokens_median']:.0f} scored tokens",
        "| texts/s (median) | n | bertattn | reference | ratio (>= 2x) |",
        "| --- | --- | --- | --- | --- |",
    ]
    names = {
        "colbert short": "encode_document, short passages vs sentence-transformers",
        "colbert 256-token": "encode_document, 256-token passages vs sentence-transformers",
        "m3 256-token": f"bge-m3-shaped ({result['layers']} layers), 3 outputs vs transformers"
        " + 2 linear",
    }
    for key, label in names.items():
        r = result[key]
        verdict = "met" if r["ratio"] >= TARGET else "not met"
        lines.append(
            f"| {label} | {r['texts']} | {r['bertattn_per_s']:.3g} | {r['reference_per_s']:.3g} "
            f"| {r['ratio']:.2f}x: {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=512)
    parser.add_argument("--long", type=int, default=128)
    parser.add_argument("--m3-texts", type=int, default=32)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time in CPU seconds, not wall time (a shared machine; use with --threads 1)",
    )
    args = parser.parse_args()
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)  # sentence-transformers' and transformers' threads
    clock = time.process_time if args.cpu_time else time.perf_counter
    result = run(args.short, args.long, args.m3_texts, args.layers, args.repeats, threads, clock)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
