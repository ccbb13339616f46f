"""OpenVINO int8 (NNCF post-training quantization) as a peer of ``Bert.load(dtype="int8")``.

    python -m benchmarks.int8_openvino [--ir DIR] [--preset mixed] [--calibration 300]
        [--rounds 7] [--threads N] [--cpu-time] [--bf16-emulated] [--short 256] [--paragraphs 48]

Needs ``openvino`` and, to make the int8 model, ``nncf`` (``pip install nncf openvino``: not in
requirements-bench.txt, nncf pulls in a long list of packages). The model is exported to ONNX
with :func:`bertattn.deploy.onnx_export.export_onnx` as in ``openvino_peer.py``, read by
OpenVINO and quantized by ``nncf.quantize`` (``model_type=TRANSFORMER``, which adds SmoothQuant,
``--preset`` mixed: symmetric weights, asymmetric activations) on ``--calibration`` texts one at a
time, unpadded: two thirds standard-library docstring sentences of 8-20 words, one third
passages, all disjoint from the holdout below and from bertattn's own calibration set. The int8
IR is saved to ``--ir`` (weights not compressed to f16) with ``quantization.json`` saying how it
was made; an existing IR there is reused as is. Of the NNCF settings tried on all-MiniLM-L6-v2
(nncf 3.4.0), this default (mixed, SmoothQuant alpha 0.95, fast bias correction) kept the most
fidelity; the performance preset, SmoothQuant off or at 0.5, and full bias correction each kept
less.

Same texts as ``python -m benchmarks.int8``: fidelity on the 500 short / 100 paragraph holdout
against bertattn float32 (min / mean cosine of the mean-pooled, normalized embeddings; share of
each text's 10 nearest neighbours kept), texts/s on the first 256 / 48 of them, the peers
interleaved round by round (rotating who goes first) after a warm-up, medians. OpenVINO peers
run as in ``openvino_peer.py``: ``INFERENCE_NUM_THREADS`` = the threads given, ``LATENCY``,
length-sorted batches of 32, bertattn's tokenizer, ``max_length`` 256. ``openvino int8`` keeps
the layers that are not int8 in f32 (``INFERENCE_PRECISION_HINT`` f32, like bertattn int8);
where bf16 is native (AMX / avx512_bf16) ``openvino int8+bf16`` is OpenVINO's default there, the
rest of the graph in bf16. ``--bf16-emulated`` adds that peer on a CPU without native bf16
too, labelled ``(emulated)`` with the number of runtime nodes OpenVINO runs in bf16 there (it
converts to and from bf16 around f32 arithmetic: not what a bf16 CPU gets). ``--cpu-time`` times
each call in this process's CPU seconds instead of wall time (a shared machine; use it with
``--threads 1``: OpenVINO and torch both run in this process). Where bertattn int8 is refused,
the refusal is printed and the other peers are still measured to the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from bertattn import Bert
from bertattn.bench import environment
from bertattn.encoder import int8

from .corpus import stdlib_docstring_corpus, stdlib_paragraph_corpus
from .int8 import per_round, print_fidelity, short_texts, timed_sets
from .openvino_peer import _bf16_node_count, _encoder

PRESETS = ("mixed", "performance")


def calibration_texts(n: int, holdout: list[str]) -> list[str]:
    """``n`` texts for NNCF: 2/3 docstring sentences of 8-20 words, 1/3 docstring passages,
    none of them in ``holdout`` or in bertattn's int8.CALIBRATION."""
    taken = set(holdout) | set(int8.CALIBRATION)
    n_par = n // 3
    sentences = [
        t for t in stdlib_docstring_corpus(6000) if 8 <= len(t.split()) <= 20 and t not in taken
    ][: n - n_par]
    passages = [t for t in stdlib_paragraph_corpus(100 + 2 * n_par) if t not in taken][-n_par:]
    texts = sentences + passages if n_par else sentences
    if len(texts) < n:
        raise ValueError(f"only {len(texts)} calibration texts disjoint from the holdout")
    return texts


def quantize(ir: Path, tokenizer, texts: list[str], preset: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Export, quantize with NNCF on ``texts`` (one unpadded text per sample), save
    ``ir/model.xml``; return what was done."""
    import nncf
    import openvino as ov

    from bertattn.deploy.onnx_export import export_onnx

    core = ov.Core()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bertattn-ov-int8-") as tmp:
        model = core.read_model(str(export_onnx(None, Path(tmp) / "model.onnx")))
    samples = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in texts:
            b = tokenizer([t], max_length=256)
            samples.append(
                {
                    "input_ids": b.input_ids.numpy(),
                    "attention_mask": b.attention_mask.numpy(),
                    "token_type_ids": b.token_type_ids.numpy(),
                }
            )
    quantized = nncf.quantize(
        model,
        nncf.Dataset(samples),
        preset=getattr(nncf.QuantizationPreset, preset.upper()),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(samples),
    )
    ir.mkdir(parents=True, exist_ok=True)
    ov.save_model(quantized, str(ir / "model.xml"), compress_to_fp16=False)
    made = {
        "nncf": nncf.__version__,
        "openvino": ov.get_version(),
        "preset": preset,
        "model_type": "TRANSFORMER",
        "calibration_texts": len(samples),
        "calibration_tokens": int(sum(s["input_ids"].shape[1] for s in samples)),
        "seconds": round(time.perf_counter() - start, 1),
    }
    (ir / "quantization.json").write_text(json.dumps(made, indent=1) + "\n")
    return made


def _fake_quantize_count(model) -> int:  # type: ignore[no-untyped-def]
    return sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ir", type=Path, default=Path(tempfile.gettempdir()) / "ov-int8")
    ap.add_argument("--preset", choices=PRESETS, default="mixed")
    ap.add_argument("--calibration", type=int, default=300, help="NNCF calibration texts")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="default: torch's count")
    ap.add_argument("--short", type=int, default=256, help="short texts timed")
    ap.add_argument("--paragraphs", type=int, default=48, help="paragraphs timed")
    ap.add_argument("--no-f32", action="store_true", help="leave OpenVINO f32 out")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time in CPU seconds, not wall time (a shared machine; use with --threads 1)",
    )
    ap.add_argument(
        "--bf16-emulated",
        action="store_true",
        help="time OpenVINO int8+bf16 on a CPU without native bf16 too (labelled emulated)",
    )
    args = ap.parse_args(argv)
    try:
        import openvino as ov
    except ImportError:
        raise SystemExit("openvino is not installed (pip install nncf openvino)") from None
    warnings.filterwarnings("ignore", message=".*truncated.*")
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    env = environment()
    native_bf16 = env["bf16_matmul"] == "native"
    print(
        f"torch {env['torch']}, openvino {ov.get_version()}, {threads} threads, "
        f"{env['processor']}; capability {env['cpu_capability']}; int8 instructions: "
        f"{int8.cpu_int8_isa()}; bf16 {env['bf16_matmul']}"
    )
    fp32 = Bert.load(threads=threads)
    holdout = {"short": short_texts(500), "paragraphs": stdlib_paragraph_corpus(100)}

    xml = args.ir / "model.xml"
    if not xml.exists():
        texts = calibration_texts(args.calibration, holdout["short"] + holdout["paragraphs"])
        try:
            made = quantize(args.ir, fp32.tokenizer, texts, args.preset)
        except ImportError as exc:
            raise SystemExit(f"cannot quantize: {exc} (pip install nncf)") from None
        print(f"quantized to {xml}: {made}")
    else:
        made_file = args.ir / "quantization.json"
        made = json.loads(made_file.read_text()) if made_file.exists() else {}
        print(f"reusing {xml}: {made or 'made elsewhere'}")

    start = time.perf_counter()
    try:
        q8: Bert | None = Bert.load(dtype="int8", threads=threads)
        print(f"bertattn int8 load {time.perf_counter() - start:.1f} s")
    except ValueError as exc:  # refused on this CPU: OpenVINO is still measured
        q8 = None
        print(f"bertattn int8 refused after {time.perf_counter() - start:.1f} s: {exc}")
    core = ov.Core()
    props = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    q_model = core.read_model(str(xml))
    compiled = {
        "openvino int8": core.compile_model(
            q_model, "CPU", {**props, "INFERENCE_PRECISION_HINT": "f32"}
        )
    }
    if native_bf16 or args.bf16_emulated:
        label = "openvino int8+bf16" + ("" if native_bf16 else " (emulated)")
        compiled[label] = core.compile_model(
            q_model, "CPU", {**props, "INFERENCE_PRECISION_HINT": "bf16"}
        )
        print(f"{label}: {_bf16_node_count(compiled[label])} runtime nodes in bf16")
    if not args.no_f32:
        from bertattn.deploy.onnx_export import export_onnx

        with tempfile.TemporaryDirectory(prefix="bertattn-ov-") as tmp:
            f_model = core.read_model(str(export_onnx(None, Path(tmp) / "model.onnx")))
        compiled["openvino f32"] = core.compile_model(
            f_model, "CPU", {**props, "INFERENCE_PRECISION_HINT": "f32"}
        )
    print(f"int8 IR: {_fake_quantize_count(q_model)} FakeQuantize nodes")
    encoders = {name: _encoder(c, fp32.tokenizer) for name, c in compiled.items()}
    peers = {"bertattn fp32": fp32.encode, **encoders}
    if q8 is not None:
        peers["bertattn int8"] = q8.encode
    than = "bertattn int8" if q8 is not None else "bertattn fp32"

    print_fidelity(peers, holdout, "bertattn fp32")

    unit = "texts/CPU-s" if args.cpu_time else "texts/s"
    for name, texts, tokens, timer, med in timed_sets(peers, holdout, args, fp32.tokenizer):
        print(
            f"{name} ({len(texts)} texts, {tokens / len(texts):.0f} tokens/text), medians of "
            f"{args.rounds} rounds ({'CPU' if args.cpu_time else 'wall'} time):"
        )
        for peer in peers:
            ratios = per_round(timer, peer, than)
            print(
                f"  {peer:31s} {len(texts) / med[peer]:8.1f} {unit}  "
                f"{med['bertattn fp32'] / med[peer]:.2f}x bertattn fp32  "
                f"{med[than] / med[peer]:.2f}x {than} (per-round "
                f"{statistics.median(ratios):.2f}x, {min(ratios):.2f}-"
                f"{max(ratios):.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
