"""Where one call's time goes: torch.profiler's top operators of one encode call, bertattn and
its torch reference on the same inputs (the "measured bound" of a speed target not met).

    python -m benchmarks.profile_top {minilm-paragraphs,modernbert-long,colbert-256,m3,
                                      int8-gte,int8-modernbert}
        [--threads 1] [--rows 10] [--length 2048] [--layers 6] [--texts 48] [--shapes]

Scenarios (the same folders and texts as the benchmark that times them):

- ``minilm-paragraphs``: ``Bert.encode`` (all-MiniLM-L6-v2, float32) of ``--texts`` docstring
  paragraphs cut at 256 tokens (``benchmarks.int8_openvino``'s; its OpenVINO peer runs outside
  torch and is not profiled);
- ``modernbert-long``: one ``--length``-token document through the random ModernBERT-base of
  ``benchmarks.modern``, against transformers sdpa;
- ``colbert-256``: ``encode_document`` of ``--texts`` 256-token passages on the folder of
  ``benchmarks.multi_vector``, against sentence-transformers;
- ``m3``: bge-m3's three outputs on ``--texts`` passages, the bge-m3-shaped model of
  ``benchmarks.multi_vector`` cut to ``--layers`` layers, against transformers + 2 linear.

Each peer is called once to warm up, then once under the profiler (CPU activities); the table
is sorted by self CPU time. The total printed is the profiled call's CPU seconds. ``--shapes``
adds a second table with each operator split by its input shapes (which product, which
attention call).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .corpus import stdlib_paragraph_corpus

SCENARIOS = (
    "minilm-paragraphs",
    "modernbert-long",
    "colbert-256",
    "m3",
    "int8-gte",
    "int8-modernbert",
)
Call = Callable[[], object]


def peers(scenario: str, args: argparse.Namespace, tmp: Path) -> dict[str, Call]:
    """The calls to profile for ``scenario``: bertattn first, then its torch reference."""
    threads = args.threads
    if scenario == "minilm-paragraphs":
        from bertattn import Bert

        bert = Bert.load(threads=threads)
        texts = stdlib_paragraph_corpus(100)[: args.texts]
        return {"bertattn fp32": lambda: bert.encode(texts)}
    if scenario == "modernbert-long":
        from .modern import bertattn_encoder, make_folder, transformers_encoder

        folder = make_folder("modernbert", tmp)
        doc = [" ".join(stdlib_paragraph_corpus(400))]
        ours = bertattn_encoder(folder, args.length, threads)
        theirs = transformers_encoder(folder, args.length)
        return {"bertattn": lambda: ours(doc), "transformers sdpa": lambda: theirs(doc)}
    if scenario.startswith("int8-"):
        return int8_peers(scenario.removeprefix("int8-"), args, tmp)
    from .multi_vector import TransformersM3, build_colbert, build_m3

    texts = stdlib_paragraph_corpus(128)[: args.texts]
    if scenario == "colbert-256":
        from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

        from bertattn import MultiVectorEncoder

        folder = build_colbert(tmp / "colbert")
        ours_mv = MultiVectorEncoder(folder, threads=threads)
        st = STMultiVectorEncoder(str(folder), device="cpu")
        return {
            "bertattn": lambda: ours_mv.encode_document(texts, batch_size=32),
            "sentence-transformers": lambda: st.encode_document(texts, batch_size=32),
        }
    from bertattn import M3Encoder

    folder = build_m3(tmp / "m3", args.layers)
    m3 = M3Encoder(folder, threads=threads, batch_size=32)
    ref = TransformersM3(folder)
    flags = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    return {
        "bertattn": lambda: m3.encode(texts, **flags),
        "transformers": lambda: ref.encode(texts),
    }


def int8_peers(family: str, args: argparse.Namespace, tmp: Path) -> dict[str, Call]:
    """int8 (u8 x s7, forced), float32 and transformers float32 on ``--texts`` passages."""
    from bertattn import Bert

    from .int8_families import make_folder, quantized
    from .modern import transformers_encoder

    folder = make_folder(family, tmp, args.layers)
    q, _ = quantized(folder, "u8s7")
    f32 = Bert.load(folder, dtype="float32")
    hf = transformers_encoder(folder, 256)
    texts = stdlib_paragraph_corpus(max(args.texts, 8))[: args.texts]

    def enc(b: Bert) -> Call:
        return lambda: b.encode(texts, batch_size=32, pooling="mean", normalize=True,
                                max_length=256, convert_to_tensor=True)  # fmt: skip

    return {"bertattn int8": enc(q), "bertattn fp32": enc(f32),
            "transformers fp32": lambda: hf(texts)}  # fmt: skip


def profile(name: str, call: Call, rows: int, shapes: bool = False) -> None:
    """Warm ``call`` once, profile one call, print its top ``rows`` operators by self CPU time
    (and, with ``shapes``, by operator and input shapes)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch.inference_mode():
        call()
        start = time.process_time()
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
            call()
        spent = time.process_time() - start
    print(f"\n{name}: one call, {spent:.2f} CPU s (profiled)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))
    if shapes:
        by_shape = prof.key_averages(group_by_input_shape=True)
        print(by_shape.table(sort_by="self_cpu_time_total", row_limit=rows,
                             max_name_column_width=40, max_shapes_column_width=100))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=10, help="operators shown")
    ap.add_argument("--length", type=int, default=2048, help="modernbert-long: tokens")
    ap.add_argument("--layers", type=int, default=6, help="m3: layers of the bge-m3 shape")
    ap.add_argument("--texts", type=int, default=48, help="texts per call (not modernbert-long)")
    ap.add_argument("--shapes", action="store_true", help="also split operators by input shape")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{args.scenario}, {args.threads} threads, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="bertattn-profile-") as tmp:
        for name, call in peers(args.scenario, args, Path(tmp)).items():
            profile(name, call, args.rows, args.shapes)


if __name__ == "__main__":
    main()
