"""Run an exported BERT in ONNX Runtime behind the :class:`bertattn.Bert` pipeline.

:class:`OnnxBertModel` stands in for :class:`BertModel` at inference: same call, same output
type. :func:`load_onnx_bert` puts it into a :class:`Bert` with the folder's tokenizer, pooling
and normalization, so ``Bert.encode`` (batching, pooling, normalizing) is the one code path for
both engines.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..encoder.config import BertConfig
from ..encoder.folder import ModelFolder
from ..encoder.model import BertModelOutput
from ..encoder.pipeline import Bert
from ..errors import MissingExtraError
from .onnx_export import BERT_INPUTS

__all__ = ["OnnxBertModel", "load_onnx_bert"]

_COMPARED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def _session(path: Path, threads: int | None, providers: tuple[str, ...]):  # type: ignore[no-untyped-def]
    try:
        import onnxruntime as ort
    except ImportError:
        raise MissingExtraError("running an ONNX model", "onnxruntime", "onnx") from None
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model {path} does not exist.")
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    try:
        return ort.InferenceSession(str(path), options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own types (InvalidProtobuf, Fail, ...)
        raise ValueError(f"{path}: ONNX Runtime cannot load it: {exc}") from None


class OnnxBertModel:
    """A :class:`BertModel` stand-in (inference only) that runs an ONNX file in ONNX Runtime.

    Args:
        path: a file written by :func:`bertattn.deploy.export_onnx` (or any BERT export with
            inputs ``input_ids``, ``attention_mask`` [, ``token_type_ids``] and the last hidden
            state as its first output).
        config: the model's config; read from the file's metadata when None.
        threads: ONNX Runtime intra-op threads (None: its default, one per physical core).
        providers: ONNX Runtime execution providers.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        config: BertConfig | None = None,
        threads: int | None = None,
        providers: tuple[str, ...] = ("CPUExecutionProvider",),
    ) -> None:
        self.path = Path(path)
        self.session = _session(self.path, threads, providers)
        meta = self.session.get_modelmeta().custom_metadata_map
        kind = meta.get("bertattn.kind")
        if kind is not None and kind != "bert":
            raise ValueError(
                f"{self.path} holds a bertattn {kind!r} export, not a BERT model; export one "
                f"with `bertattn export-onnx` or bertattn.deploy.export_onnx."
            )
        saved = json.loads(meta["bertattn.config"]) if "bertattn.config" in meta else None
        if config is None:
            if saved is None:
                raise ValueError(
                    f"{self.path} has no bertattn config in its metadata; pass config= (the "
                    f"model folder's config.json)."
                )
            config = BertConfig.from_dict(saved, source=f"{self.path} metadata")
        elif saved is not None:
            diff = [k for k in _COMPARED if saved.get(k) != getattr(config, k)]
            if diff:
                pairs = ", ".join(f"{k}={saved.get(k)} vs {getattr(config, k)}" for k in diff)
                raise ValueError(
                    f"{self.path} was exported from a different model than the given config "
                    f"({pairs}); pass the model folder it was exported from."
                )
        self.config = config
        names = [i.name for i in self.session.get_inputs()]
        missing = [n for n in BERT_INPUTS[:2] if n not in names]
        if missing:
            raise ValueError(
                f"{self.path} has inputs {names}; a BERT export needs input_ids and "
                f"attention_mask (and optionally token_type_ids)."
            )
        self.input_names = [n for n in BERT_INPUTS if n in names]
        self.output_names = [o.name for o in self.session.get_outputs()]

    # the parts of BertModel's interface that Bert uses
    device = torch.device("cpu")
    dtype = torch.float32

    def eval(self) -> OnnxBertModel:
        return self

    def __call__(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_attentions: object = False,
    ) -> BertModelOutput:
        """Like :meth:`BertModel.forward`; attention weights are not in the ONNX graph."""
        if output_attentions:
            raise ValueError(
                "attention weights are not exported to ONNX; use the PyTorch model "
                "(Bert.load) for attention maps."
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        given = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
        }
        feed = {
            n: np.ascontiguousarray(given[n].cpu().numpy(), dtype=np.int64)
            for n in self.input_names
        }
        outs = dict(zip(self.output_names, self.session.run(None, feed), strict=True))
        hidden = torch.from_numpy(outs.get("last_hidden_state", next(iter(outs.values()))))
        pooled = outs.get("pooler_output")
        return BertModelOutput(hidden, None if pooled is None else torch.from_numpy(pooled))


def load_onnx_bert(
    onnx_path: str | Path,
    model: str | Path | ModelFolder | None = None,
    *,
    threads: int | None = None,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
) -> Bert:
    """A :class:`Bert` whose forward pass runs ``onnx_path`` in ONNX Runtime.

    ``model`` is the folder the file was exported from (default all-MiniLM-L6-v2; a hub name
    or a resolved :class:`ModelFolder` too): it gives the config, the tokenizer (checked
    against the config), pooling, normalization and max length, exactly as :meth:`Bert.load`
    reads them (:func:`bertattn.encoder.folder.resolve_model`).
    """
    from ..encoder.dense import read_dense
    from ..encoder.folder import resolve_model

    folder = resolve_model(model)
    tokenizer = folder.load_tokenizer()
    engine = OnnxBertModel(onnx_path, config=folder.config, threads=threads, providers=providers)
    return Bert(
        engine,  # type: ignore[arg-type]  (duck-typed BertModel: config, device, __call__)
        tokenizer,
        pooling=folder.pooling,
        normalize=folder.normalize,
        max_length=folder.max_length,
        name=f"{folder.name} (onnx)",
        folder=folder,
        dense=[read_dense(d, "sentence_embedding") for d in folder.dense],
    )
