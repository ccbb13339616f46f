"""sentence-transformers' ``Dense`` modules: a linear projection and an activation, read from a
module folder (``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``).

Two kinds of folder hold them: a sentence-transformers model projects its pooled sentence
embedding (EmbeddingGemma: ``2_Dense`` 768 -> 3072, ``3_Dense`` 3072 -> 768, between its
Pooling and Normalize), a multi-vector model each token. A folder's ``module_input_name`` says
which; the wrong one is refused by name. The activation is looked up by its torch name in a
fixed table (never imported from a file)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..errors import ModelFolderError
from .jsonfile import read_json_object, show

__all__ = ["ACTIVATIONS", "DENSE_TYPES", "Projection", "check_dense", "read_dense"]

#: the ``modules.json`` type names of a Dense module (sentence-transformers < 6 and >= 6)
DENSE_TYPES = frozenset(
    {
        "sentence_transformers.base.modules.dense.Dense",
        "sentence_transformers.base.modules.Dense",
        "sentence_transformers.models.Dense",
        "pylate.models.Dense.Dense",  # PyLate's: sentence-transformers' Dense and use_residual
    }
)
#: a Dense module's activation, by its torch name
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.ReLU": torch.relu,
    "torch.nn.modules.activation.GELU": torch.nn.functional.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
}
_KNOWN = {
    "in_features",
    "out_features",
    "bias",
    "activation_function",
    "module_input_name",
    "module_output_name",
    "use_residual",
}
#: what a Dense of each level projects, for the refusal of the other level
_LEVELS = {
    "token_embeddings": "a multi-vector Dense projects each token ('token_embeddings'), not a "
    "sentence embedding",
    "sentence_embedding": "a sentence-transformers Dense after Pooling projects the pooled "
    "'sentence_embedding', not each token",
}


@dataclass(frozen=True)
class Projection:
    """One Dense module: ``weight`` ``(out, in)``, ``bias`` ``(out,)`` or None, and its
    activation's torch name; ``(..., in) -> (..., out)``, on the input's device."""

    weight: Tensor
    bias: Tensor | None
    activation: str

    @property
    def out_features(self) -> int:
        """The width it projects to."""
        return int(self.weight.shape[0])

    def to(self, device: torch.device | str) -> Projection:
        """The same projection with its tensors on ``device``."""
        bias = None if self.bias is None else self.bias.to(device)
        return Projection(self.weight.to(device), bias, self.activation)

    def __call__(self, x: Tensor) -> Tensor:
        w = self.weight.to(x.device, x.dtype)
        b = None if self.bias is None else self.bias.to(x.device, x.dtype)
        return ACTIVATIONS[self.activation](torch.nn.functional.linear(x, w, b))


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The Dense module's tensors, from ``model.safetensors`` or ``pytorch_model.bin``."""
    st = folder / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = folder / "pytorch_model.bin"
    if pt.is_file():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise ModelFolderError(
        f"{folder}: no model.safetensors or pytorch_model.bin for the Dense projection."
    )


def check_dense(folder: Path, level: str, converting: bool = False) -> dict:
    """``folder/config.json`` of a Dense module projecting ``level`` (``"token_embeddings"``
    or ``"sentence_embedding"``), checked without reading its weights; the config.
    ``converting``: a SentenceTransformer folder's sentence-level Dense run on each token (as
    sentence-transformers converts such a folder to a multi-vector one)."""
    path = folder / "config.json"
    cfg = read_json_object(path)
    extra = sorted(set(cfg) - _KNOWN)
    if extra:
        raise ModelFolderError(f"{path}: bertattn does not know the Dense settings {extra}.")
    if cfg.get("use_residual", False) is not False:
        raise ModelFolderError(
            f"{path}: use_residual {show(cfg['use_residual'])} is not supported by bertattn's "
            f"MultiVectorEncoder (it runs a plain projection); use sentence-transformers."
        )
    kept = (level, None, *(("sentence_embedding",) if converting else ()))
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, level) not in kept:
            raise ModelFolderError(f"{path}: {key} is {show(cfg.get(key))}; {_LEVELS[level]}.")
    act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if act not in ACTIVATIONS:
        raise ModelFolderError(
            f"{path}: activation_function {show(act)} is not one bertattn runs; it runs "
            f"{sorted(ACTIVATIONS)}."
        )
    return cfg


def read_dense(
    folder: Path, level: str = "token_embeddings", *, converting: bool = False
) -> Projection:
    """The Dense module in ``folder`` (see :func:`check_dense`), its weights read and checked
    against its config, as float32."""
    cfg = check_dense(folder, level, converting)
    path = folder / "config.json"
    act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    tensors = read_weights(folder)
    weight = tensors.pop("linear.weight", None)
    bias = tensors.pop("linear.bias", None)
    n_in, n_out = cfg.get("in_features"), cfg.get("out_features")
    if weight is None or tuple(weight.shape) != (n_out, n_in):
        got = None if weight is None else tuple(weight.shape)
        raise ModelFolderError(
            f"{folder}: linear.weight must be ({n_out}, {n_in}) (out_features, in_features), "
            f"got {got}."
        )
    if bool(cfg.get("bias", True)) != (bias is not None) or tensors:
        names = sorted(tensors) + (["linear.bias"] if bias is not None else [])
        raise ModelFolderError(
            f"{folder}: the tensors {names} do not match bias={show(cfg.get('bias', True))} "
            f"in {path}."
        )
    return Projection(weight.float(), None if bias is None else bias.float(), act)
