"""Deploy paths on all-MiniLM-L6-v2, in one run: ONNX Runtime vs bertattn eager (sentences/s
through the same Bert.encode pipeline), and torch.compile (inductor) vs eager on one batch.

    PYTHONPATH=src python benchmarks/deploy_throughput.py [N] [THREADS]

Short on purpose: the machine is shared. Both engines get the same number of threads.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks.encode_throughput import sentences
from bertattn import Bert
from bertattn.deploy import export_onnx, load_onnx_bert


def _rate(bert: Bert, texts: list[str]) -> float:
    bert.encode(texts[:64])  # warm-up
    t0 = time.perf_counter()
    bert.encode(texts, batch_size=32)
    return len(texts) / (time.perf_counter() - t0)


def _interleaved_ms(fns, runs: int = 10) -> list[float]:  # type: ignore[no-untyped-def]
    """Median ms of each function, runs interleaved so a busy shared machine hurts all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [1e3 * statistics.median(ts) for ts in times]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else torch.get_num_threads()
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    texts = sentences(n)
    eager = Bert.load()
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        path = export_onnx(eager.model, Path(d) / "minilm.onnx")
        export_s = time.perf_counter() - t0
        ort_rate = _rate(load_onnx_bert(path, threads=threads), texts)
        from onnxruntime.transformers.optimizer import optimize_model

        cfg = eager.model.config
        opt = optimize_model(
            str(path),
            model_type="bert",
            num_heads=cfg.num_attention_heads,
            hidden_size=cfg.hidden_size,
        )
        opt_path = Path(d) / "minilm_opt.onnx"
        opt.save_model_to_file(str(opt_path))
        fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
        opt_rate = _rate(load_onnx_bert(opt_path, threads=threads), texts)
        eager_rate = _rate(eager, texts)
        ort_rate = max(ort_rate, _rate(load_onnx_bert(path, threads=threads), texts))
        eager_rate = max(eager_rate, _rate(eager, texts))  # best of two, alternated
    print(
        f"{n} sentences, {threads} threads (torch and ONNX Runtime intra-op); "
        f"export {export_s:.0f}s"
    )
    print(f"bertattn eager (PyTorch, auto backend): {eager_rate:8.1f} sentences/s")
    print(f"ONNX Runtime (math export, opset 18):   {ort_rate:8.1f} sentences/s")
    print(f"ONNX Runtime, BERT optimizer applied:   {opt_rate:8.1f} sentences/s  fused {fused}")

    batch = eager.tokenizer(texts[:32], max_length=eager.max_length)
    args = (batch.input_ids, batch.attention_mask, batch.token_type_ids)
    model = eager.model
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    with torch.inference_mode():
        t0 = time.perf_counter()
        compiled(*args)
        compile_s = time.perf_counter() - t0
        diff = (compiled(*args).last_hidden_state - model(*args).last_hidden_state).abs().max()
        eager_ms, compiled_ms = _interleaved_ms([lambda: model(*args), lambda: compiled(*args)])
    shape = "x".join(map(str, batch.input_ids.shape))
    print(
        f"torch.compile (inductor, fullgraph, dynamic) on a {shape} batch: "
        f"eager {eager_ms:.1f} ms, "
        f"compiled {compiled_ms:.1f} ms, speedup {eager_ms / compiled_ms:.2f}x "
        f"(first call {compile_s:.0f}s; max |diff| {diff:.1e})"
    )


if __name__ == "__main__":
    main()
