"""bertattn inside sentence-transformers.

* :class:`BertattnTransformer`: a sentence-transformers input module, the counterpart of
  ``sentence_transformers.models.Transformer`` for BERT: it tokenizes with bertattn's tokenizer
  and runs :class:`bertattn.BertModel`, and writes ``token_embeddings`` for the modules after
  it (``Pooling``, ``Normalize``, ...)::

      model = SentenceTransformer(modules=[
          BertattnTransformer(folder),
          Pooling(384, pooling_mode="mean"),
          Normalize(),
      ])

* :func:`bertattn_sentence_transformer`: that whole model for a sentence-transformers folder
  (or a Hugging Face BERT folder), with the folder's pooling, normalization, maximum length and
  ``config_sentence_transformers.json`` settings: ``bertattn_sentence_transformer(path)
  .encode(texts)`` gives what ``SentenceTransformer(path).encode(texts)`` gives.

A model built this way saves (``model.save(dir)``) to a folder that ``SentenceTransformer(dir)``
loads back with this module; the module's own files are a plain Hugging Face BERT folder
(``config.json``, ``model.safetensors`` with Hugging Face's tensor names, the tokenizer files).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sentence_transformers import SentenceTransformer
from torch import Tensor

from ..arguments import split_pairs
from ..encoder.checkpoint import bertattn_to_hf_keys
from ..encoder.config import BertConfig
from ..encoder.folder import ModelFolder, ModelFolderNotFoundError, resolve_model
from ..encoder.model import BertModel
from ..encoder.st_compat import SentenceTransformerConfig, processing_max_length

try:  # sentence-transformers >= 6
    from sentence_transformers.base.modules import InputModule, Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    #: sentence-transformers >= 6's Transformer tags each batch with its modality
    _MODALITY: str | None = "text"
except ImportError:  # older: the same classes in sentence_transformers.models
    _MODALITY = None
    from sentence_transformers.models import Normalize, Pooling  # type: ignore[no-redef]

    try:
        from sentence_transformers.models import InputModule  # type: ignore[no-redef]
    except ImportError:  # before 4.x: any torch module with the same methods
        from torch.nn import Module as InputModule  # type: ignore[assignment]

__all__ = ["BertattnTransformer", "bertattn_sentence_transformer"]

#: the tokenizer files a Hugging Face BERT folder may hold, copied by ``save``
_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def _module_folder(path: Path, max_length: int | None) -> ModelFolder:
    """The Hugging Face BERT folder ``path`` of a saved :class:`BertattnTransformer`, as a
    :class:`ModelFolder` (its ``modules.json``, if any, names this module, which
    :func:`resolve_model` does not read: it is not looked at)."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelFolderNotFoundError(
            f"{path}: no config.json; a BertattnTransformer module folder is a Hugging Face "
            f"BERT folder (config.json, model.safetensors, tokenizer)."
        )
    return ModelFolder(
        str(path), path, path, BertConfig.from_json_file(config_path), max_length=max_length
    )


def _not_an_input(i: int, item: object) -> ValueError:
    return ValueError(
        f"inputs[{i}] is a {type(item).__name__}; BertattnTransformer takes texts "
        f"(str) or text pairs (a tuple of two str)."
    )


class BertattnTransformer(InputModule):
    """A sentence-transformers first module running :class:`bertattn.BertModel`.

    Args:
        model_name_or_path: a Hugging Face BERT folder, a sentence-transformers folder (its
            Transformer module is used), a cached hub name, a resolved
            :class:`~bertattn.encoder.folder.ModelFolder`, or None (the default model).
        max_seq_length: longest input in tokens (default: the folder's
            ``sentence_bert_config.json``, else the tokenizer's), at most
            ``max_position_embeddings``.
        do_lower_case: lowercase the texts before tokenizing (as sentence-transformers does).
        attention_backend: bertattn's attention backend (``"auto"``, ``"sdpa"``, ``"math"``,
            ``"varlen"``); named so because sentence-transformers' own ``backend`` means
            torch / onnx / openvino.
        dtype: the compute dtype (see :meth:`bertattn.BertModel.to_compute_dtype`).

    Features: :meth:`preprocess` gives ``input_ids``, ``attention_mask``, ``token_type_ids``
    (``(B, L)``) and, with a prompt, ``prompt_length``; :meth:`forward` adds
    ``token_embeddings`` ``(B, L, E)`` (zeros at padding positions under the ``varlen``
    backend, which never computes them; pooling ignores them).
    """

    config_file_name = "sentence_bert_config.json"
    config_keys = ["max_seq_length", "do_lower_case"]
    save_in_root = True

    def __init__(
        self,
        model_name_or_path: str | Path | ModelFolder | None = None,
        max_seq_length: int | None = None,
        *,
        do_lower_case: bool | None = None,
        attention_backend: str = "auto",
        dtype: torch.dtype | str | None = None,
    ) -> None:
        super().__init__()
        folder = resolve_model(model_name_or_path)
        self.folder = folder
        self.attention_backend = attention_backend
        self.tokenizer = folder.load_tokenizer()
        self.model = BertModel.from_pretrained(folder, dtype=dtype, backend=attention_backend)
        self.do_lower_case = folder.do_lower_case if do_lower_case is None else bool(do_lower_case)
        limit = max_seq_length or folder.max_length or self.tokenizer.model_max_length
        self.max_seq_length = int(limit)
        self._prompt_lengths: dict[str, int] = {}

    # ------------------------------------------------------------------ sizes
    @property
    def max_seq_length(self) -> int:
        """Longest input in tokens; longer texts are truncated (and reported)."""
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        top = self.model.config.max_position_embeddings
        if isinstance(value, bool) or not isinstance(value, int) or not 3 <= value:
            raise ValueError(f"max_seq_length must be an int >= 3, got {value!r}.")
        self._max_seq_length = min(value, top)

    def get_embedding_dimension(self) -> int:
        """The width of ``token_embeddings``: the model's ``hidden_size``."""
        return self.model.config.hidden_size

    def get_word_embedding_dimension(self) -> int:
        """The older name of :meth:`get_embedding_dimension` (sentence-transformers < 6)."""
        return self.get_embedding_dimension()

    # ------------------------------------------------------------------ inputs
    def _texts(
        self, inputs: Sequence[Any], prompt: str | None
    ) -> tuple[list[str], list[str] | None]:
        if isinstance(inputs, str):
            raise ValueError("inputs must be a sequence of texts; wrap a single text in a list.")
        firsts, maybe = split_pairs(inputs, _not_an_input)
        seconds = [t for t in maybe if t is not None]
        if seconds and len(seconds) != len(firsts):
            raise ValueError("mix of single texts and text pairs in one batch; use one kind.")
        if prompt:
            firsts = [prompt + t for t in firsts]
        if self.do_lower_case:
            firsts = [t.lower() for t in firsts]
            seconds = [t.lower() for t in seconds]
        return firsts, (seconds or None)

    def _prompt_length(self, prompt: str) -> int:
        """Tokens of ``prompt`` at the start of a text, [CLS] included, the final [SEP] not
        (what sentence-transformers' Pooling excludes when ``include_prompt=False``)."""
        if prompt not in self._prompt_lengths:
            text = prompt.lower() if self.do_lower_case else prompt
            ids = self.tokenizer.encode_batch([text], max_length=self.max_seq_length)[0].ids
            self._prompt_lengths[prompt] = len(ids) - 1
        return self._prompt_lengths[prompt]

    def preprocess(
        self, inputs: Sequence[Any], prompt: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Tokenize and pad a batch of texts (or text pairs): ``input_ids``,
        ``attention_mask``, ``token_type_ids``, ``modality`` (``"text"``, with
        sentence-transformers >= 6, as its Transformer gives it) and ``prompt_length`` with a
        prompt. ``max_length=`` or ``processing_kwargs={"text": {"max_length": N}}`` (the
        latter wins, as in sentence-transformers) overrides :attr:`max_seq_length` for this
        call; other processing settings are refused (bertattn's tokenizer pads to the
        longest text and truncates longest-first)."""
        limit = processing_max_length(
            kwargs.get("processing_kwargs"), kwargs.get("max_length") or self.max_seq_length
        )
        if len(inputs) == 0:
            return {}
        texts, pairs = self._texts(inputs, prompt)
        batch = self.tokenizer(texts, pairs, max_length=int(limit))  # type: ignore[arg-type]
        features: dict[str, Any] = {
            "input_ids": batch.input_ids,
            "token_type_ids": batch.token_type_ids,
            "attention_mask": batch.attention_mask,
        }
        if _MODALITY is not None:
            features["modality"] = _MODALITY
        if prompt:
            features["prompt_length"] = self._prompt_length(prompt)
        return features

    # ------------------------------------------------------------------ forward
    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Add ``token_embeddings`` ``(B, L, E)``: bertattn's ``BertModel`` on the batch."""
        input_ids: Tensor = features["input_ids"]
        device = self.model.device
        mask = features.get("attention_mask")
        types = features.get("token_type_ids")
        out = self.model(
            input_ids.to(device),
            None if mask is None else mask.to(device),
            None if types is None else types.to(device),
        )
        features["token_embeddings"] = out.last_hidden_state
        return features

    # ------------------------------------------------------------------ save / load
    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any):
        """A Hugging Face BERT folder (``config.json``, weights with Hugging Face's names, the
        tokenizer files) plus ``sentence_bert_config.json``."""
        out = Path(output_path)
        out.mkdir(parents=True, exist_ok=True)
        source = self.folder.model_dir
        for name in ("config.json", *_TOKENIZER_FILES):
            src = source / name
            if src.is_file() and not (out / name).resolve() == src.resolve():
                shutil.copyfile(src, out / name)
        names = bertattn_to_hf_keys(self.model.config, pooler=self.model.pooler is not None)
        # clone: the fused q/k/v weights share one storage, which safetensors refuses
        state = {
            names[k]: v.detach().to("cpu").clone().contiguous()
            for k, v in self.model.state_dict().items()
        }
        for stale in ("model.safetensors", "pytorch_model.bin"):
            if (out / stale).is_file():
                (out / stale).unlink()
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        else:
            torch.save(state, out / "pytorch_model.bin")
        self.save_config(str(out))

    def get_config_dict(self) -> dict[str, Any]:
        return {"max_seq_length": self.max_seq_length, "do_lower_case": self.do_lower_case}

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        backend: str = "torch",
        attention_backend: str = "auto",
        **kwargs: Any,
    ) -> BertattnTransformer:
        """Load a module saved by :meth:`save` (how ``SentenceTransformer(dir)`` loads it).
        ``backend`` is sentence-transformers' runtime: only ``"torch"`` is supported."""
        if backend != "torch":
            raise ValueError(
                f"BertattnTransformer runs on torch only, not backend={backend!r}; for ONNX use "
                f"bertattn's own export (bertattn export-onnx)."
            )
        hub = {
            "token": token,
            "cache_folder": cache_folder,
            "revision": revision,
            "local_files_only": local_files_only,
        }
        local = cls.load_dir_path(model_name_or_path, subfolder=subfolder, **hub)
        if local is None:
            raise ModelFolderNotFoundError(
                f"{model_name_or_path}: no module folder {subfolder!r} for BertattnTransformer."
            )
        config = cls.load_config(model_name_or_path, subfolder=subfolder, **hub)
        max_length = config.get("max_seq_length")
        folder = _module_folder(Path(local), max_length)
        dtype = (kwargs.get("model_kwargs") or {}).get("dtype")
        return cls(
            folder,
            max_length,
            do_lower_case=bool(config.get("do_lower_case", False)),
            attention_backend=attention_backend,
            dtype=dtype,
        )

    def __repr__(self) -> str:
        return (
            f"BertattnTransformer({{'max_seq_length': {self.max_seq_length}, 'do_lower_case': "
            f"{self.do_lower_case}, 'attention_backend': {self.attention_backend!r}, 'model': "
            f"{self.folder.name!r}}}) with bertattn.BertModel"
        )


def bertattn_sentence_transformer(
    path: str | Path | ModelFolder | None = None,
    *,
    attention_backend: str = "auto",
    dtype: torch.dtype | str | None = None,
    device: str | None = None,
) -> SentenceTransformer:
    """A ``SentenceTransformer`` for the model folder ``path`` (a sentence-transformers folder,
    a Hugging Face BERT folder, a cached hub name, or None for the default model) running
    bertattn: ``[BertattnTransformer, Pooling, Normalize]`` with the folder's pooling (mean /
    cls), normalization and maximum length, and the prompts and similarity function of its
    ``config_sentence_transformers.json``. A plain Hugging Face folder gets [CLS] pooling and
    no normalization, as in :class:`bertattn.Bert`."""
    folder = resolve_model(path)
    first = BertattnTransformer(folder, attention_backend=attention_backend, dtype=dtype)
    modules: list[torch.nn.Module] = [
        first,
        Pooling(first.get_embedding_dimension(), pooling_mode=folder.pooling),
    ]
    if folder.normalize:
        modules.append(Normalize())
    st = SentenceTransformerConfig.read(folder)  # as Bert reads it: one reader, checked
    extra: dict[str, Any] = {"prompts": st.prompts}
    if st.default_prompt_name is not None:
        extra["default_prompt_name"] = st.default_prompt_name
    if st.similarity_fn_name is not None:
        extra["similarity_fn_name"] = st.similarity_fn_name
    return SentenceTransformer(modules=modules, device=device, **extra)
