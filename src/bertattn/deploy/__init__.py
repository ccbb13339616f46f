"""Deploy paths: ONNX export, ONNX Runtime encoding (``onnx``/``onnxruntime`` are optional:
``pip install 'bertattn[onnx]'``), and notes on ``torch.compile`` (README, "Deploying")."""

from .onnx_export import DEFAULT_OPSET, EXPORT_BACKENDS, export_attention_onnx, export_onnx
from .onnx_runtime import OnnxBertModel, load_onnx_bert

__all__ = [
    "DEFAULT_OPSET",
    "EXPORT_BACKENDS",
    "OnnxBertModel",
    "export_attention_onnx",
    "export_onnx",
    "load_onnx_bert",
]
