"""Today's small embedders at their released shapes: bertattn ``Bert.encode`` against
transformers' native classes (sdpa where the class has it) and, where the folder exports,
OpenVINO f32 on the same ONNX graph; fp32 and the dtype ``auto`` picks on this CPU, peers in the
same run, interleaved, medians.

    python -m benchmarks.embedders [--family qwen3,eurobert,gemma3_text,deberta-v2]
                                   [--short 64] [--passages 8] [--layers 0] [--repeats 3]
                                   [--threads N] [--cpu-time] [--no-openvino]

No checkpoint of these architectures is installable here, so each is random weights (seeded) at
its released shape, saved by transformers, with all-MiniLM-L6-v2's WordPiece tokenizer (30,522
tokens: the work per token is the real model's but for the embedding lookup and the output
layer, which an encoder does not run):

- ``qwen3``: Qwen3-Embedding-0.6B (28 layers, 1,024 wide, 16 query heads over 8 key/value
  heads of 128, SwiGLU 3,072, q/k RMSNorm, causal);
- ``eurobert``: EuroBERT-210m (12 layers, 768 wide, 12 heads, SwiGLU 3,072, bidirectional);
- ``gemma3_text``: EmbeddingGemma-300m (24 layers, 768 wide, 3 query heads over 1 key/value
  head of 256, GeGLU 1,152, a sliding window of 512 on five layers in six, bidirectional);
- ``deberta-v2``: DeBERTa-v3-base (12 layers, 768 wide, 12 heads, 3,072, disentangled
  attention with 256 position buckets).

``--layers N`` cuts every model to its first N layers (the ratio per layer is what is compared;
on a 2-core machine a 28-layer model at 512 tokens takes minutes a round). Target (issue 56):
bertattn >= 1.5x transformers on short texts and 512-token passages, in fp32 and in ``auto``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from bertattn import Bert
from bertattn.bench import environment

from .corpus import stdlib_docstring_corpus, stdlib_paragraph_corpus
from .modern import _speeds, random_folder, transformers_encoder
from .openvino_peer import openvino_encoders

SHAPES = {
    "qwen3": ("Qwen3Model", "Qwen3Config", dict(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, max_position_embeddings=32768,
        rope_theta=1_000_000.0, pad_token_id=0,
    )),
    "eurobert": ("EuroBertModel", "EuroBertConfig", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
        intermediate_size=3072, max_position_embeddings=8192, pad_token_id=0,
        bos_token_id=101, eos_token_id=102, mask_token_id=103,
    )),
    "gemma3_text": ("Gemma3TextModel", "Gemma3TextConfig", dict(
        hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1,
        head_dim=256, intermediate_size=1152, sliding_window=512, query_pre_attn_scalar=256,
        max_position_embeddings=2048, use_bidirectional_attention=True, pad_token_id=0,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                     for i in range(24)],
    )),
    "deberta-v2": ("DebertaV2Model", "DebertaV2Config", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=512, relative_attention=True, position_buckets=256,
        max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
        pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
        pad_token_id=0,
    )),
}  # fmt: skip
TARGET = 1.5


def make_folder(family: str, root: Path, layers: int = 0) -> Path:
    """A random folder of ``family`` at its released shape (first ``layers`` layers when > 0)
    with MiniLM's tokenizer, seeded."""
    return random_folder(SHAPES[family], root / family, layers)


def _bertattn(folder: Path, max_length: int, dtype: str):
    bert = Bert.load(folder, dtype=dtype)
    return bert, lambda texts: bert.encode(
        texts, batch_size=32, pooling="mean", normalize=True, max_length=max_length
    )


def compare(family: str, folder: Path, args: argparse.Namespace) -> list[dict]:
    """Texts/s of every peer per scenario, bertattn's ratios and min cosine to transformers."""
    scenarios = [
        ("short texts", stdlib_docstring_corpus(args.short), 256),
        ("512-token passages", stdlib_paragraph_corpus(args.passages), 512),
    ]
    onnx = None
    if args.openvino:
        try:
            from bertattn.deploy.onnx_export import export_onnx

            onnx = export_onnx(str(folder), folder.parent / f"{family}.onnx")
        except Exception as exc:  # a refusal by name is the result for this family
            print(f"{family}: no ONNX export, so no OpenVINO peer: {exc}")
    rows = []
    for name, texts, length in scenarios:
        bert, fp32 = _bertattn(folder, length, "float32")
        encoders = {"bertattn fp32": fp32}
        auto_bert, auto = _bertattn(folder, length, "auto")
        picked = str(next(auto_bert.model.parameters()).dtype).replace("torch.", "")
        if picked != "float32":
            encoders[f"bertattn auto ({picked})"] = auto
        try:
            encoders["transformers sdpa"] = transformers_encoder(folder, length)
        except ValueError:  # a class without sdpa (DeBERTa-v2): its eager attention
            encoders["transformers eager"] = transformers_encoder(folder, length, "eager")
        peer = next(k for k in encoders if k.startswith("transformers"))
        if onnx is not None:
            ov, _, why = openvino_encoders(
                folder, bert.tokenizer, ("f32",), onnx=onnx, max_length=length
            )
            encoders.update(ov)
            if why:
                print(why)
        want = encoders[peer](texts)
        cos = {k: float((f(texts) * want).sum(1).min()) for k, f in encoders.items()}
        clock = time.process_time if args.cpu_time else time.perf_counter
        speed = _speeds(encoders, texts, args.repeats, clock)
        rows.append({"family": family, "scenario": name, "auto": picked, "speed": speed,
                     "min_cosine": cos})  # fmt: skip
    return rows


def print_rows(rows: list[dict]) -> None:
    for row in rows:
        print(f"\n{row['family']}, {row['scenario']} (texts/s, median; min cosine to "
              f"transformers; auto picks {row['auto']})")  # fmt: skip
        ours = {k: v for k, v in row["speed"].items() if k.startswith("bertattn")}
        for peer, speed in row["speed"].items():
            line = f"  {peer:<26}{speed:>9.2f}  cos {row['min_cosine'][peer]:.6f}"
            if not peer.startswith("bertattn"):
                for mine, mine_speed in ours.items():
                    ratio = mine_speed / speed
                    verdict = ""
                    if peer.startswith("transformers"):
                        verdict = f" (target {TARGET}x: {'met' if ratio >= TARGET else 'NOT met'})"
                    line += f"  {mine.split()[-1]} {ratio:.2f}x{verdict}"
            print(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default=",".join(SHAPES))
    p.add_argument("--short", type=int, default=64)
    p.add_argument("--passages", type=int, default=8)
    p.add_argument("--layers", type=int, default=0, help="cut every model to N layers (0: all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-openvino", dest="openvino", action="store_false")
    p.add_argument("--threads", type=int, default=None, help="default: torch's count")
    p.add_argument("--cpu-time", action="store_true",
                   help="this process's CPU seconds (with --threads 1 on a shared machine)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    unknown = [f for f in args.family.split(",") if f not in SHAPES]
    if unknown:
        p.error(f"unknown --family {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    print(json.dumps(environment(), indent=1))
    with tempfile.TemporaryDirectory(prefix="bertattn-embedders-") as tmp:
        for family in args.family.split(","):
            folder = make_folder(family, Path(tmp), args.layers)
            try:
                rows = compare(family, folder, args)
            except Exception as exc:  # one family refused must not hide the others
                print(f"\n{family}: not measured: {type(exc).__name__}: {exc}")
                continue
            print_rows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
