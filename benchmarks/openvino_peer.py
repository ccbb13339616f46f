"""OpenVINO as an optional peer of the encode benchmark (``pip install -r requirements-bench.txt``).

The model is exported once to ONNX with :func:`bertattn.deploy.onnx_export.export_onnx` into a
temporary folder, then compiled by OpenVINO on CPU twice: ``INFERENCE_PRECISION_HINT`` f32 and
bf16, ``INFERENCE_NUM_THREADS`` = ``torch.get_num_threads()``. Encoding mirrors the transformers
peer: length-sorted batches of 32, ``max_length`` 256, bertattn's own tokenizer, mean pooling
over real tokens, L2 normalization.

Note on bf16: OpenVINO's CPU plugin accepts the bf16 hint even on a CPU without
avx512_bf16 / AMX and then runs part of the graph in bf16 through conversions (emulation), so
its bf16 numbers there say nothing about native bf16. :func:`openvino_encoders` reports how many
runtime nodes each compiled model actually runs in bf16.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

INSTALL_HINT = "pip install -r requirements-bench.txt"
PRECISIONS = ("f32", "bf16")


def _bf16_node_count(compiled) -> int:  # type: ignore[no-untyped-def]
    """Runtime nodes the compiled model executes in bf16 (0 when it runs all in f32)."""
    count = 0
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "runtimePrecision" in info and info["runtimePrecision"].astype(str) == "bf16":
            count += 1
    return count


def _encoder(
    compiled, tokenizer, max_length: int = 256, batch_size: int = 32
) -> Callable[[list[str]], np.ndarray]:  # type: ignore[no-untyped-def]
    request = compiled.create_infer_request()
    hidden_size = compiled.output("last_hidden_state").get_partial_shape()[2].get_length()

    def encode(texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), hidden_size), dtype=np.float32)
        with warnings.catch_warnings():  # truncation to 256 is expected, as for the peers
            warnings.simplefilter("ignore")
            for s in range(0, len(order), batch_size):
                idx = order[s : s + batch_size]
                batch = tokenizer([texts[i] for i in idx], max_length=max_length)
                mask = batch.attention_mask.numpy()
                request.infer(
                    {
                        "input_ids": batch.input_ids.numpy(),
                        "attention_mask": mask,
                        "token_type_ids": batch.token_type_ids.numpy(),
                    }
                )
                hidden = request.get_tensor("last_hidden_state").data
                m = mask[:, :, None].astype(np.float32)
                emb = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
                emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
                out[idx] = emb
        return out

    return encode


def openvino_encoders(
    folder: str | Path,
    tokenizer,
    precisions: tuple[str, ...] = PRECISIONS,
    onnx: str | Path | None = None,
    max_length: int = 256,
    batch_size: int = 32,
) -> tuple[dict[str, Callable[[list[str]], np.ndarray]], dict[str, object], str | None]:  # type: ignore[no-untyped-def]
    """``({"openvino f32": encode, "openvino bf16": encode}, info, None)``, or
    ``({}, {}, one line saying why the peer is missing)`` when openvino or the ONNX exporter is
    not installed. ``info``: the OpenVINO version and, per precision, the precision the compiled
    model reports and how many runtime nodes run in bf16. ``onnx``: an export made earlier
    (:func:`export_once`) instead of a new one. ``max_length``: tokens kept per text;
    ``batch_size``: texts per inference (sorted by length)."""
    try:
        import openvino as ov
    except ImportError:
        return {}, {}, f"openvino peer missing: openvino is not installed ({INSTALL_HINT})"
    from bertattn.deploy.onnx_export import export_onnx

    threads = torch.get_num_threads()
    core = ov.Core()
    with tempfile.TemporaryDirectory(prefix="bertattn-ov-") as tmp:
        try:
            path = onnx or export_onnx(str(folder), Path(tmp) / "model.onnx")
        except ImportError as exc:  # MissingExtraError: the bertattn[onnx] extra
            return {}, {}, f"openvino peer missing: cannot export ONNX: {exc}"
        model = core.read_model(str(path))
        compiled = {
            p: core.compile_model(
                model,
                "CPU",
                {
                    "INFERENCE_PRECISION_HINT": p,
                    "INFERENCE_NUM_THREADS": threads,
                    "PERFORMANCE_HINT": "LATENCY",
                },
            )
            for p in precisions
        }
    info: dict[str, object] = {"version": ov.get_version(), "threads": threads}
    for p, c in compiled.items():
        info[p] = {
            "reported_precision": c.get_property("INFERENCE_PRECISION_HINT").to_string(),
            "bf16_runtime_nodes": _bf16_node_count(c),
            "runtime_nodes": len(c.get_runtime_model().get_ops()),
        }
    encoders = {
        f"openvino {p}": _encoder(c, tokenizer, max_length, batch_size) for p, c in compiled.items()
    }
    return encoders, info, None
