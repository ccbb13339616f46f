"""Deploy paths: ONNX export, ONNX Runtime encoding, and ``torch.compile``.

* :func:`export_onnx` / :func:`export_attention_onnx` write one ONNX file (dynamic batch and
  sequence axes, the padding mask an input); ``bertattn export-onnx`` is the command.
* :func:`load_onnx_bert` gives a :class:`bertattn.Bert` whose forward pass runs in ONNX Runtime
  (same tokenizer, pooling, normalization); ``bertattn encode --onnx FILE`` is the command.
* ``torch.compile(model, fullgraph=True, dynamic=True)`` works on ``MultiHeadAttention`` and
  ``BertModel`` with the ``math`` and ``sdpa`` backends (and ``auto``, which picks them inside an
  encoder): one graph for every sequence length. ``varlen`` compiles only with graph breaks: it
  packs the batch with offsets read from the mask (``nonzero``, ``.tolist()``) and loops over the
  sequences in Python, which is data-dependent; ``fullgraph=True`` refuses it.

Opsets ``MIN_OPSET..MAX_OPSET`` are exported, each exactly as asked (:func:`check_opset` refuses
the rest before any work). ``onnx``, ``onnxscript`` and ``onnxruntime`` are optional: ``pip
install 'bertattn[onnx]'`` (:class:`bertattn.errors.MissingExtraError` names it when missing).
"""

from .onnx_export import (
    DEFAULT_OPSET,
    EXPORT_BACKENDS,
    MAX_OPSET,
    MIN_OPSET,
    check_opset,
    export_attention_onnx,
    export_onnx,
)
from .onnx_runtime import OnnxBertModel, load_onnx_bert

__all__ = [
    "DEFAULT_OPSET",
    "EXPORT_BACKENDS",
    "MAX_OPSET",
    "MIN_OPSET",
    "OnnxBertModel",
    "check_opset",
    "export_attention_onnx",
    "export_onnx",
    "load_onnx_bert",
]
