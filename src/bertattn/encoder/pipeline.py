"""``Bert``: a model and its tokenizer. Sentence embeddings and attention maps from texts.

Reads sentence-transformers settings when the folder has them (``modules.json``, the pooling
config, ``sentence_bert_config.json``, ``config_sentence_transformers.json``), so
``Bert.load(folder).encode(texts)`` gives what ``SentenceTransformer(folder).encode(texts)``
gives; :meth:`Bert.encode` takes ``SentenceTransformer.encode``'s parameters (same order,
defaults and return types), and :meth:`Bert.similarity` / :meth:`Bert.similarity_pairwise` /
:meth:`Bert.get_embedding_dimension` / :attr:`Bert.max_seq_length` are there too, and the rest of
its surface from :class:`~bertattn.encoder.st_surface.SentenceTransformerSurface`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..arguments import (
    ArgumentTypeError,
    check_bool,
    check_choice,
    check_embedding_pair,
    check_int,
    check_str,
    describe,
    is_int,
)
from ..attention.dispatch import explaining
from ..attention.dispatch import note as explain_note
from ..attention.steps import record_steps
from ..dtypes import dtype_name, parse_dtype
from ..engine import ModelStep
from ..errors import ModelFolderError
from ..families import registry as families
from ..maps import AttentionMaps
from ..runtime.device import resolve_device
from ..runtime.threads import ThreadChoice, ThreadGovernor, choose_threads
from ..runtime.threads import apply as apply_threads
from . import late_chunks as _late_chunks
from . import steps as _steps_view
from .auto_dtype import DtypeChoice, choose_dtype
from .compiled import CompileChoice
from .dense import Projection, read_dense
from .encode_call import (
    BERTATTN_NAMES,
    ENCODE,
    ST_NAMES,
    Batching,
    EncodeCall,
    Pooled,
    arguments,
    finish,
    output_of,
    progress_bar,
    takes,
)
from .folder import POOLINGS, ModelFolder, default_model_dir, resolve_model
from .graphs import GraphedBert
from .model import BertModel
from .pooling import EncodeStats, length_batches, pool
from .st_compat import (
    OUTPUT_VALUES,
    PRECISIONS,
    SIMILARITY_FN_NAMES,
    ST_CONFIG_FILE,
    SentenceTransformerConfig,
    UnsupportedArgumentError,
    input_aliases,
    pairwise_similarity,
    processing_max_length,
    quantize_embeddings,
    similarity_matrix,
    text_inputs,
    text_list,
)
from .st_surface import SentenceTransformerSurface
from .tokenizer import BertTokenizer

logger = logging.getLogger("bertattn.encoder")

__all__ = [
    "OUTPUT_VALUES",
    "POOLINGS",
    "PRECISIONS",
    "SIMILARITY_FN_NAMES",
    "ST_CONFIG_FILE",
    "Bert",
    "EncodeStats",
    "SentenceTransformerConfig",
    "UnsupportedArgumentError",
    "quantize_embeddings",
    "resolve_device",
    "default_model_dir",  # re-exported from .folder for old callers
    "read_sentence_settings",
]


@dataclass
class SentenceSettings:
    """What a sentence-transformers folder says about pooling and length (kept for old
    callers; :class:`ModelFolder` has the same fields)."""

    model_dir: Path
    pooling: str = "cls"
    normalize: bool = False
    max_length: int | None = None


def read_sentence_settings(folder: str | Path | None) -> SentenceSettings:
    """Deprecated: the pooling / normalize / max length of :func:`resolve_model` ``(folder)``;
    call :func:`bertattn.encoder.folder.resolve_model` instead."""
    resolved = resolve_model(folder)
    return SentenceSettings(
        resolved.model_dir, resolved.pooling, resolved.normalize, resolved.max_length
    )


def _layer_list(layers: object, name: str, n: int) -> list[int]:
    """``layers``: layer indices (ints, NumPy integers too; -n..-1 count from the end) ->
    a list in ``0..n - 1``."""
    try:
        if isinstance(layers, (str, bytes)):
            raise TypeError
        items = list(layers)  # type: ignore[call-overload]
    except TypeError:
        raise ArgumentTypeError(
            f"{name} must be a sequence of layer indices (ints in 0..{n - 1}), got "
            f"{describe(layers)}."
        ) from None
    out = []
    for i in items:
        out.append(check_int(i, f"{name} entry", low=-n, high=n - 1, why=f"{n} layers"))
    return [i % n for i in out]  # type: ignore[operator]


def _load_target(device: object, int8: bool) -> torch.device | None:
    """The device :meth:`Bert.load` puts the model on (None: the CPU, untouched); int8 only on
    the CPU."""
    if int8 and not _cpu_or_auto(device):
        raise ValueError(f"dtype='int8' runs on the CPU only; got device={device!r}.")
    target = None if device is None else resolve_device(device)  # type: ignore[arg-type]
    if int8 and target is not None and target.type != "cpu":
        raise ValueError(f"dtype='int8' runs on the CPU only; device={device!r} is {target}.")
    return target


def _check_int8_around(value: object, int8: bool) -> None:
    """``int8_around`` of :meth:`Bert.load`: one of ``"auto"``, ``"float32"``, ``"bfloat16"``,
    and other than ``"auto"`` only with ``dtype="int8"``."""
    from .int8_around import check_around

    if check_around(value) != "auto" and not int8:
        raise ValueError(
            f"int8_around={value!r} applies to dtype='int8' only; pass dtype='int8' with it, "
            f"or leave int8_around out."
        )


def _cpu_or_auto(device: object) -> bool:
    """Whether ``device`` (unchecked) may stand for the CPU: None, ``"auto"``, ``"cpu"``."""
    if device is None or device == "auto":
        return True
    if isinstance(device, torch.device):
        return device.type == "cpu"
    return isinstance(device, str) and device.strip().split(":")[0] == "cpu"


def _log_loaded(bert: Bert, folder: ModelFolder, int8: bool) -> None:
    """One INFO line: what :meth:`Bert.load` loaded, from where, in which dtype, on which device."""
    cfg = bert.model.config
    logger.info(
        "model %s from %s: %d layers, hidden %d, %d heads, %s on %s; pooling %s, "
        "normalize %s, max_length %s",
        folder.name, folder.model_dir, cfg.num_hidden_layers, cfg.hidden_size,
        cfg.num_attention_heads, "int8" if int8 else dtype_name(bert.model.dtype), bert.device,
        folder.pooling, folder.normalize, bert.max_length,
    )  # fmt: skip


class Bert(SentenceTransformerSurface):
    """A BERT model with its tokenizer and sentence settings.

    Attributes:
        model, tokenizer; pooling (``"mean"`` / ``"cls"`` / ``"max"``), normalize, max_length
        (tokens; also :attr:`max_seq_length`), name;
        folder: the :class:`ModelFolder` it was loaded from (None when built directly);
        prompts, default_prompt_name, similarity_fn_name, truncate_dim, include_prompt: the
        folder's ``config_sentence_transformers.json`` (see :class:`SentenceTransformerConfig`);
        dense: the folder's Dense modules, run in order on the pooled embedding before the
        normalization (:class:`~bertattn.encoder.dense.Projection`; empty: none);
        cuda_graphs: on a CUDA device, encode by replaying CUDA graphs (default True; see
        :mod:`bertattn.encoder.graphs`); graph_runner: the :class:`GraphedBert` doing it (made on
        first use on CUDA; assign one to choose its settings).
        threads: the thread policy's choice (:class:`bertattn.runtime.threads.ThreadChoice`;
        set by :meth:`load`, None for a hand-built ``Bert``); governor: the
        :class:`bertattn.runtime.threads.ThreadGovernor` that lowers the count in
        :meth:`encode`'s loop when other processes take cores (None: the count stays as torch
        has it).
        dtype_choice: with :meth:`load` ``(dtype="auto")``, the
        :class:`~bertattn.encoder.auto_dtype.DtypeChoice` that picked the compute dtype, with its
        reason (also :attr:`dtype_reason`); None when a dtype was given or none was.
    """

    def __init__(
        self,
        model: BertModel,
        tokenizer: BertTokenizer,
        *,
        pooling: str = "cls",
        normalize: bool = False,
        max_length: int | None = None,
        name: str = "",
        folder: ModelFolder | None = None,
        dense: Sequence[Projection] = (),
    ) -> None:
        check_choice(pooling, "pooling", POOLINGS)
        check_int(max_length, "max_length", low=1, optional=True)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = bool(normalize)
        limit = model.config.max_position_embeddings
        self.max_length = min(max_length or tokenizer.model_max_length, limit)
        self.name = name
        self.folder = folder
        self.dense = tuple(dense)
        st = SentenceTransformerConfig.read(folder)
        self.prompts = st.prompts
        self.default_prompt_name = st.default_prompt_name
        self._similarity_fn_name = st.similarity_fn_name
        self.truncate_dim = st.truncate_dim
        self.include_prompt = st.include_prompt
        self.cuda_graphs = True
        self.graph_runner: GraphedBert | None = None
        self.threads: ThreadChoice | None = None
        self.governor: ThreadGovernor | None = None
        self.dtype_choice: DtypeChoice | None = None
        self.compiled: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None
        self.compile_choice: CompileChoice | None = None
        self._pooling_notice = None if folder is None else folder.pooling_notice

    def pooling_for(self, pooling: str | None, *, pooled: bool = True) -> str:
        """``pooling`` checked, else :attr:`pooling`. The first time a plain folder's mean
        pooling is taken by default for ``pooled`` rows (not token rows alone), its notice is
        said (a ``UserWarning``, once per model; the command line prints it as
        ``bertattn encode: warning: ...``)."""
        given = check_choice(pooling, "pooling", POOLINGS, optional=True)
        notice = getattr(self, "_pooling_notice", None)
        if given is None and pooled and notice and self.pooling == "mean":
            warnings.warn(notice, UserWarning, stacklevel=3)
            self._pooling_notice = None
        return given or self.pooling

    @classmethod
    def load(
        cls,
        path: str | Path | ModelFolder | None = None,
        *,
        dtype: torch.dtype | str | None = None,
        backend: str = "auto",
        device: str | int | torch.device | None = None,
        threads: int | None = None,
        compile: bool = False,
        task: str | None = None,
        int8_around: str = "auto",
    ) -> Bert:
        """Load a model folder (default: all-MiniLM-L6-v2), a cached hub name, or a resolved
        :class:`ModelFolder` (see :func:`bertattn.encoder.folder.resolve_model`); the tokenizer
        is checked against the config before the weights are read. ``device``: ``"auto"``
        (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a torch.device (None:
        the CPU), checked before anything is read. ``threads``: CPU threads to compute with
        (None: the thread policy of :mod:`bertattn.runtime.threads`: the CPUs this process may use,
        lowered under co-located load; a count set with ``torch.set_num_threads`` or
        ``OMP_NUM_THREADS`` is kept). ``dtype``: float32 (None), float16, bfloat16, float64, as a
        torch.dtype or its name; ``"auto"``: the dtype that is fastest on ``device`` by
        :func:`bertattn.choose_dtype`: on the CPU a timed probe of the model's own products in
        float32 and bfloat16 at its widths and thread count (bfloat16 from 1.1x as fast), cached
        per CPU model, torch version, thread count and widths (:mod:`bertattn.runtime.probe`),
        with the CPU's flag rule (bfloat16 with AMX, else float32) as the fallback when
        ``BERTATTN_DTYPE_PROBE=0`` or the timing fails; on a GPU bfloat16 where it has bf16, else
        float16. Logged at INFO with its reason and kept in :attr:`dtype_reason`. Unlike
        ``BertModel.from_pretrained(dtype="auto")``, which takes the checkpoint's dtype as
        transformers does, this looks at the machine, not the file. Or
        ``"int8"`` (CPU only, opt-in): the encoder's matrix products in int8, verified against
        float32 as it loads and refused (``ValueError`` naming the measured cosines) when it
        falls short; see :mod:`bertattn.encoder.int8`. ``int8_around`` (with ``"int8"`` only):
        what runs between the int8 products (residual stream, LayerNorms, GELU, attention):
        ``"float32"``, ``"bfloat16"``, or ``"auto"`` (bfloat16 where ``dtype="auto"`` would
        take it on this CPU, else float32; float32 for the families built from blocks); see
        :mod:`bertattn.encoder.int8_around`. ``compile=True`` (opt-in, never a
        default): the encoder's forward through ``torch.compile`` (inductor, frozen weights,
        dynamic shapes), compiled and checked against the eager forward as it loads; where it
        cannot run, a warning says why and the model stays eager (:attr:`compile_choice`, see
        :mod:`bertattn.encoder.compiled`). ``task``: the task adapter merged into the weights,
        for a folder that has them (Jina v3's released folder: ``"retrieval.query"``, ...);
        None: the base weights. A wrong argument raises ``TypeError`` (a
        wrong type) or ``ValueError`` naming it, before anything is read."""
        dtype = parse_dtype(dtype, auto="fastest", int8=True)
        int8 = dtype == "int8"
        if int8:
            dtype = None  # loaded in float32, then quantized ("int8" stays in the errors)
        _check_int8_around(int8_around, int8)
        check_str(backend, "backend")
        target = _load_target(device, int8)
        threads = check_int(threads, "threads", low=1, optional=True)
        check_bool(compile, "compile")
        choice = choose_threads(threads)
        folder = resolve_model(path)
        tokenizer = folder.load_tokenizer()
        auto = _fastest_dtype(folder, target, choice.threads) if dtype == "auto" else None
        dtype = dtype if auto is None else auto.dtype
        with warnings.catch_warnings():
            if target is not None and target.type != "cpu":  # it will not run on this CPU
                warnings.filterwarnings("ignore", message="this CPU has no native")
            model = BertModel.from_pretrained(folder, dtype=dtype, backend=backend, task=task)
        bert = cls(
            model,
            tokenizer,
            pooling=folder.pooling,
            normalize=folder.normalize,
            max_length=folder.max_length,
            name=folder.name,
            folder=folder,
            dense=[read_dense(d, "sentence_embedding") for d in folder.dense],
        )
        bert.dtype_choice = auto
        bert = bert if target is None else bert.to(target)
        bert._speed_paths(choice, int8=int8_around if int8 else None, compile=compile)
        _log_loaded(bert, folder, int8)
        return bert

    def _speed_paths(self, choice: ThreadChoice, *, int8: str | None, compile: bool) -> None:
        """After :meth:`load` placed the model: its threads on the CPU (and their governor),
        then int8 (quantized and verified; ``int8``: what runs around its products, None: no
        int8) and the compiled forward, where asked."""
        if self.device.type == "cpu":
            apply_threads(choice)
            self.threads = choice
            self.governor = ThreadGovernor(choice.threads) if choice.adaptive else None
        if int8 is not None:
            from . import int8 as _int8

            families.require(self.model.config.family, "int8", "dtype='int8'")
            _int8.verify(_int8.quantize_model(self, around=int8))
        if compile:
            from .compiled import compile_bert

            self.compile_choice = compile_bert(self)

    # ------------------------------------------------------------------ device, settings
    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self.model.device

    def to(self, device: str | int | torch.device) -> Bert:
        """Move the model to ``device`` (see :func:`resolve_device`); returns self."""
        target = resolve_device(device)
        if target.type == "cuda" and target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
        if target == self.model.device:
            return self  # (a move repacks every layer's q/k/v storage: not for nothing)
        if isinstance(self.model, torch.nn.Module):
            if self.compiled is not None:  # its graph holds the weights where they were
                logger.info("compiled forward dropped on the move to %s: eager there", target)
                self.compiled = None
            self.model.to(target)
            self.dense = tuple(p.to(target) for p in self.dense)
        else:  # e.g. the ONNX Runtime stand-in
            raise ValueError(
                f"this model ({type(self.model).__name__}) runs on {self.model.device} only; "
                f"it cannot move to {target}."
            )
        return self

    @property
    def precision(self) -> str:
        """What the encoder computes in: ``"int8"`` after :meth:`load` ``(dtype="int8")``, else
        the model's dtype without ``torch.`` (``"float32"``, ``"bfloat16"``, ...)."""
        from .int8 import is_int8

        if is_int8(self.model):
            return "int8"
        return dtype_name(self.model.dtype)

    @property
    def dtype_reason(self) -> str | None:
        """Why :meth:`load` ``(dtype="auto")`` chose the model's dtype, or for
        ``dtype="int8"`` the form its products run in with their measured speed, and the
        dtype around them and why (None: neither)."""
        int8_speed = getattr(self.model, "int8_speed", None)
        if int8_speed is not None:
            around = getattr(self.model, "int8_around", None)
            return f"int8 products as {int8_speed}" + ("" if around is None else f"; {around}")
        return None if self.dtype_choice is None else self.dtype_choice.reason

    @property
    def max_seq_length(self) -> int:
        """sentence-transformers' name for :attr:`max_length` (tokens kept per text)."""
        return self.max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        top = self.model.config.max_position_embeddings
        if not is_int(value):
            raise ArgumentTypeError(
                f"max_seq_length must be an int in 1..{top}, got {describe(value)}."
            )
        if not 1 <= value <= top:
            raise ValueError(f"max_seq_length must be an int in 1..{top}, got {value!r}.")
        self.max_length = int(value)

    @property
    def similarity_fn_name(self) -> str:
        """``"cosine"`` (the default), ``"dot"``, ``"euclidean"`` or ``"manhattan"``: what
        :meth:`similarity` computes; from the folder's config, settable."""
        return self._similarity_fn_name or "cosine"

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: str | None) -> None:
        value = getattr(value, "value", value)  # sentence-transformers' SimilarityFunction
        if value is not None and not isinstance(value, str):
            raise ArgumentTypeError(
                f"similarity_fn_name must be one of {SIMILARITY_FN_NAMES} or None, got "
                f"{describe(value)}."
            )
        if value is not None and value not in SIMILARITY_FN_NAMES:
            raise ValueError(
                f"similarity_fn_name {value!r} is not supported; use one of {SIMILARITY_FN_NAMES}."
            )
        self._similarity_fn_name = value

    def similarity(self, embeddings1: object, embeddings2: object) -> Tensor:
        """``(N, M)`` scores between every row of ``embeddings1`` and of ``embeddings2``
        (arrays, tensors, lists of either; a 1-D vector is one row), by
        :attr:`similarity_fn_name`: cosine, dot product, or the negative euclidean / manhattan
        distance, as sentence-transformers computes them. Both must have one width (one model's
        embeddings); float64 with float32 computes in float64."""
        x, y = check_embedding_pair(embeddings1, embeddings2, rows=False)
        return similarity_matrix(self.similarity_fn_name, x, y)

    def similarity_pairwise(self, embeddings1: object, embeddings2: object) -> Tensor:
        """``(N,)`` scores of ``embeddings1[i]`` with ``embeddings2[i]``, by
        :attr:`similarity_fn_name` (see :meth:`similarity`); both hold the same number of rows
        (or one of them is one vector)."""
        x, y = check_embedding_pair(embeddings1, embeddings2, rows=True)
        return pairwise_similarity(self.similarity_fn_name, x, y)

    def get_embedding_dimension(self) -> int:
        """The width of :meth:`encode`'s sentence embeddings (``hidden_size``, or the last Dense
        module's ``out_features``; the folder's ``truncate_dim`` when smaller)."""
        width = self.pooled_width
        return width if self.truncate_dim is None else min(width, self.truncate_dim)

    @property
    def pooled_width(self) -> int:
        """The width of a sentence embedding before ``truncate_dim``: the last Dense module's
        ``out_features``, else ``hidden_size``."""
        dense = getattr(self, "dense", ())
        return dense[-1].out_features if dense else int(self.model.config.hidden_size)

    def get_sentence_embedding_dimension(self) -> int:
        """The sentence-transformers < 6 name of :meth:`get_embedding_dimension`."""
        return self.get_embedding_dimension()

    # ------------------------------------------------------------------ embeddings
    @input_aliases
    @takes(ENCODE)
    def encode(self, *args: Any, **kwargs: Any) -> Any:
        """Sentence embeddings, as ``SentenceTransformer.encode`` gives them (same parameters,
        order, defaults and return types), plus bertattn's keywords.

        Returns a ``(N, E)`` float32 array for a list of texts (any iterable of str: list,
        tuple, numpy array, pandas Series) or of text pairs (``(a, b)`` tuples, or an ``(N, 2)``
        array: ``[CLS] a [SEP] b [SEP]``), a ``(E,)`` array for one str; a torch tensor with
        ``convert_to_tensor``; a list of 1-D tensors with ``convert_to_numpy=False``;
        ``output_value="token_embeddings"``: a list of ``(L_i, E)`` tensors (the text's real
        tokens); ``output_value=None``: a list of dicts (input_ids, token_type_ids,
        attention_mask, modality, [prompt_length], token_embeddings, sentence_embedding), each
        padded to its batch, batched as sentence-transformers batches.
        An empty list gives a ``(0, E)`` array.

        sentence-transformers' parameters: ``prompt`` (prepended to every text) or
        ``prompt_name`` (a key of :attr:`prompts`, from the folder's
        ``config_sentence_transformers.json``; ``default_prompt_name`` applies when neither is
        given); ``show_progress_bar`` (None: on when the ``bertattn.encoder`` logger's level is
        INFO or DEBUG); ``precision``: float32, or int8 / uint8 (per-dimension buckets
        calibrated on this call's embeddings) / binary / ubinary, see
        :func:`quantize_embeddings`; ``device``: move the model there (for good, as
        sentence-transformers does); ``normalize_embeddings``: L2-normalize (after the folder's
        own Normalize module and ``truncate_dim``); ``truncate_dim``: keep the first dimensions
        (default: the folder's). ``pool`` and a list of devices (multi-process encoding) are
        not supported; ``chunk_size`` only applies to those, so it does nothing, as in
        sentence-transformers without them. ``task=`` is accepted and does nothing (no Router
        modules here). ``processing_kwargs={"text": {"max_length": N}}`` means
        ``max_length=N``; other processing settings are refused (see
        :data:`bertattn.encoder.st_surface.DIFFERENCES`).

        bertattn's keywords: ``pooling`` (``"mean"`` / ``"cls"`` / ``"max"``; default the
        folder's), ``normalize`` (override the folder's Normalize module), ``max_length``
        (tokens kept; default :attr:`max_length`), ``progress(n)`` (called after each batch
        with its number of texts), ``batch_tokens`` (cap a batch's padded tokens). Texts are
        sorted by token count and batched, so each batch pads little; on the CPU a batch of
        short texts takes more than ``batch_size`` of them, up to the tokens that keep every
        core busy and never more than ``batch_size`` texts of ``max_length`` tokens hold
        (:meth:`BertModel.fill_tokens`).
        """
        given = arguments(ENCODE, self, args, kwargs)
        verbose = logger.getEffectiveLevel() in (logging.INFO, logging.DEBUG)
        show_progress_bar = progress_bar(given["show_progress_bar"], verbose)
        output = output_of(given)
        extra = given["kwargs"]
        processing = extra.pop("processing_kwargs", None)
        max_length = processing_max_length(processing, given["max_length"])
        self._refuse_unsupported(given["pool"], given["device"], extra)
        prompt = self._resolve_prompt(given["prompt"], given["prompt_name"])
        truncate_dim = self.truncate_dim if given["truncate_dim"] is None else given["truncate_dim"]
        call = EncodeCall(
            Batching(given["batch_size"], given["batch_tokens"], max_length, show_progress_bar,
                     given["progress"]),
            Pooled(given["pooling"], given["normalize"],
                   check_int(truncate_dim, "truncate_dim", low=1, optional=True),
                   bool(given["normalize_embeddings"])),
            output,
            prompt,
        )  # fmt: skip
        texts, pairs, single = text_inputs(given["inputs"], "inputs")
        if pairs is not None:
            self._check_pairs()
        if given["device"] is not None:
            self.to(given["device"])
        out, _ = self._encode(texts, pairs=pairs, **call.loop_keywords())
        return finish(out, output, single)

    def _refuse_unsupported(self, pool: object, device: object, kwargs: dict) -> None:
        multi = (
            "bertattn encodes in this process, on one device; for several processes or GPUs "
            "run `bertattn encode --workers N` (or torchrun)"
        )
        if pool is not None:
            raise UnsupportedArgumentError(
                f"pool= (a sentence-transformers multi-process pool) is not supported: {multi}."
            )
        if isinstance(device, (list, tuple)):
            raise UnsupportedArgumentError(
                f"device={device!r}: a list of devices (multi-process encoding) is not "
                f"supported: {multi}; pass one device."
            )
        task = kwargs.pop("task", None)
        if task is not None and not isinstance(task, str):
            raise ValueError(f"task must be a str or None, got {task!r}.")
        self._check_task(task)
        if kwargs:
            names = ", ".join(sorted(kwargs))
            raise UnsupportedArgumentError(
                f"Bert.encode() got keyword argument(s) it does not take: {names}. It takes "
                f"sentence-transformers' encode parameters ({', '.join(ST_NAMES)}) and "
                f"bertattn's ({', '.join(BERTATTN_NAMES)})."
            )

    def _check_task(self, task: str | None) -> None:
        """``encode(task=)`` on a model with task adapters: the one merged at load, else
        refused saying how to load another (without adapters ``task`` routes nothing, as in
        sentence-transformers without Router modules)."""
        names = getattr(self.model, "task_names", ())
        loaded = getattr(self.model, "task", None)
        if task is None or not names or task == loaded:
            return
        if task not in names:
            raise ValueError(
                f"task={task!r} is not one of this model's task adapters: {', '.join(names)}."
            )
        raise ValueError(
            f"task={task!r}: this model was loaded with task={loaded!r} (the adapter is merged "
            f"into the weights as it loads); load it with Bert.load(..., task={task!r})."
        )

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        if prompt is not None and not isinstance(prompt, str):
            raise ArgumentTypeError(
                f"prompt must be a str or None, got {prompt!r} (the 3rd positional parameter "
                f"is prompt, as in sentence-transformers: pass normalize= by keyword)."
            )
        check_str(prompt_name, "prompt_name", optional=True)
        if prompt is None:
            if prompt_name is not None:
                if prompt_name not in self.prompts:
                    hint = ""
                    if prompt_name in POOLINGS:
                        hint = (
                            f" Did you mean pooling={prompt_name!r}? The 2nd positional "
                            f"parameter is prompt_name, as in sentence-transformers: pass "
                            f"pooling= by keyword."
                        )
                    raise ValueError(
                        f"Prompt name {prompt_name!r} not found in the configured prompts "
                        f"dictionary with keys {list(self.prompts)!r}: pass one of them as "
                        f"prompt_name, or the prompt's text as prompt=.{hint}"
                    )
                prompt = self.prompts[prompt_name]
            elif self.default_prompt_name is not None:
                prompt = self.prompts.get(self.default_prompt_name)
        elif prompt_name is not None:
            logger.warning(
                "Provide either a `prompt`, a `prompt_name`, or neither, but not both. "
                "Ignoring the `prompt_name` in favor of `prompt`."
            )
        return prompt

    def encode_with_stats(
        self,
        texts: Sequence[str],
        pooling: str | None = None,
        normalize: bool | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        *,
        progress: Callable[[int], object] | None = None,
        batch_tokens: int | None = None,
        progress_tokens: Callable[[int], Callable[[int], object]] | None = None,
    ) -> tuple[np.ndarray, EncodeStats]:
        """``(N, E)`` float32 sentence embeddings, in input order, plus counts (texts, empty,
        truncated, tokens, padded): the jobs' entry point. ``texts``: an iterable of str (not
        one str); the other parameters as :meth:`encode`'s keywords of the same names.
        ``progress_tokens``: called once the texts are tokenized with their real tokens in all,
        returns what is called with each batch's real tokens (a progress bar whose ETA goes by
        tokens: the longest texts go first, so texts done would promise too much too early)."""
        if isinstance(texts, str):
            raise ArgumentTypeError(
                "texts must be a sequence of strings; wrap a single text in a list."
            )
        items, _ = text_list(texts, "texts")
        out, stats = self._encode(
            items,
            pooling=pooling,
            normalize=normalize,
            batch_size=batch_size,
            max_length=max_length,
            progress=progress,
            batch_tokens=batch_tokens,
            progress_tokens=progress_tokens,
        )
        return out.numpy(), stats  # type: ignore[union-attr]

    #: late chunking (:func:`bertattn.encoder.late_chunks.encode_late_chunks`)
    encode_late_chunks = _late_chunks.encode_late_chunks

    def _prompt_length(self, prompt: str, limit: int) -> int:
        """Tokens of ``prompt`` at the start of a prompted text: [CLS] and the prompt's own,
        not a trailing special token (as sentence-transformers counts them)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enc = self.tokenizer.encode_batch([prompt], max_length=limit)[0]
        n = len(enc.ids)
        return n - 1 if n and enc.special_tokens_mask[-1] else n

    def _encode(
        self,
        texts: list[str],
        *,
        pooling: str | None,
        normalize: bool | None,
        batch_size: int,
        max_length: int | None,
        progress: Callable[[int], object] | None,
        batch_tokens: int | None,
        prompt: str | None = None,
        output_value: str | None = "sentence_embedding",
        to_cpu: bool = True,
        normalize_embeddings: bool = False,
        truncate_dim: int | None = None,
        show_progress_bar: bool = False,
        pairs: list[str] | None = None,
        progress_tokens: Callable[[int], Callable[[int], object]] | None = None,
    ) -> tuple[Tensor | list, EncodeStats]:
        """The one encoding loop. ``output_value="sentence_embedding"``: a ``(N, E)`` float32
        tensor (on the CPU when ``to_cpu``); otherwise a list, in input order (``None``: the
        rows of :meth:`_st_rows`). ``pairs``: the second text of each text pair."""
        pooling = self.pooling_for(pooling, pooled=output_value != "token_embeddings")
        normalize = check_bool(normalize, "normalize", optional=True)
        normalize = self.normalize if normalize is None else normalize
        batch_size, limit, batch_tokens = self._batch_limits(
            batch_size, max_length, batch_tokens, progress
        )
        stats = EncodeStats(texts=len(texts), empty=sum(1 for t in texts if not t.strip()))
        width = min(self.pooled_width, truncate_dim or self.pooled_width)
        sentences = output_value == "sentence_embedding"
        out: Tensor | list = [None] * len(texts)
        if sentences:
            where = "cpu" if to_cpu else self.model.device
            out = torch.zeros((len(texts), width), dtype=torch.float32, device=where)
        if not texts:
            return out, stats
        if output_value is None:  # sentence-transformers' rows: its batching and padding
            rows = self._st_rows(
                texts, pairs, prompt=prompt, batch_size=batch_size, limit=limit, pooling=pooling,
                normalize=normalize, truncate_dim=truncate_dim,
                show_progress_bar=show_progress_bar, progress=progress,
            )  # fmt: skip
            return rows, stats
        prompt_length = self._prompt_length(prompt, limit) if prompt else 0
        skip = 0 if self.include_prompt else prompt_length  # tokens left out of pooling
        if prompt:
            texts = [prompt + t for t in texts]
        encodings = self.tokenizer.encode_batch(texts, pairs, max_length=limit)
        stats.truncated = sum(1 for e in encodings if e.overflowing)
        stats.tokens = sum(len(e.ids) for e in encodings)
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))  # longest first
        lengths = [len(encodings[i].ids) for i in order]
        ranges = self._batch_ranges(lengths, batch_size, batch_tokens, limit)
        by_tokens = None if progress_tokens is None else progress_tokens(sum(lengths))
        from tqdm import tqdm

        bar = tqdm(total=len(ranges), desc="Batches", disable=not show_progress_bar)
        step = ModelStep(self, self.forward_encodings, "hidden")  # inference mode and the governor
        with step.session(), bar:
            for start, end in ranges:
                idx = order[start:end]
                with step.timed(sum(lengths[start:end])):
                    batch, mask, hidden = step.compute([encodings[i] for i in idx])
                    stats.padded += batch.input_ids.numel()
                    if sentences:
                        emb = self._sentences(hidden, mask, pooling, normalize, skip)  # (B, E)
                        emb = _cut_and_normalize(emb, truncate_dim, normalize_embeddings)
                        out[torch.tensor(idx)] = emb.to(out.device)  # type: ignore[call-overload,union-attr]
                    else:  # token_embeddings: each text's real tokens
                        for j, i in enumerate(idx):
                            out[i] = hidden[j, : len(encodings[i].ids)]
                bar.update(1)
                if progress is not None:
                    progress(len(idx))
                if by_tokens is not None:
                    by_tokens(sum(lengths[start:end]))
        if explaining():
            self._explain_encode(step)
        return out, stats

    def _batch_limits(
        self,
        batch_size: int,
        max_length: int | None,
        batch_tokens: int | None,
        progress: Callable[[int], object] | None,
    ) -> tuple[int, int, int | None]:
        """``(batch_size, tokens kept per text, batch_tokens)`` of an encode call, checked
        (``max_length`` None: :attr:`max_length`); a ``progress`` that is not callable is
        refused with them."""
        batch_size = check_int(batch_size, "batch_size", low=1)  # type: ignore[assignment]
        top = self.model.config.max_position_embeddings
        limit = check_int(
            max_length,
            "max_length",
            low=3,
            high=top,
            optional=True,
            why=f"[CLS], [SEP] and a token of the text; the model's max_position_embeddings "
            f"is {top}",
        )
        limit = self.max_length if limit is None else limit
        batch_tokens = check_int(batch_tokens, "batch_tokens", low=1, optional=True)
        if progress is not None and not callable(progress):
            raise ArgumentTypeError(
                f"progress must be a callable (called with each batch's number of texts) or "
                f"None, got {describe(progress)}."
            )
        return batch_size, limit, batch_tokens  # type: ignore[return-value]

    def _batch_ranges(
        self, lengths: list[int], batch_size: int, batch_tokens: int | None, limit: int
    ) -> list[tuple[int, int]]:
        """The ``(start, end)`` batches of texts sorted longest first (``lengths``: their
        tokens), short ones filled past ``batch_size`` (:meth:`_fill_tokens`); a filled batch
        is said (explain, and -vv)."""
        fill = self._fill_tokens(batch_size, limit)
        ranges = length_batches(lengths, batch_size, batch_tokens, fill)
        telling = fill and (explaining() or logger.isEnabledFor(logging.DEBUG))
        most = max((e - s for s, e in ranges), default=0) if telling else 0
        if most > batch_size:
            batches = f"{len(ranges)} batch" + ("" if len(ranges) == 1 else "es")
            said = (
                f"encode: {len(lengths)} texts as {batches} (batch_size {batch_size}; "
                f"short texts fill a batch up to {fill} padded tokens, BertModel.fill_tokens: "
                f"at most {most} texts in one)"
            )
            explain_note(said)
            logger.debug("%s", said)
        return ranges

    def _explain_encode(self, step: ModelStep) -> None:
        """explain's notes after an encode: threads (and the governor), the dtype ``auto`` or
        int8 chose, the compiled forward."""
        if self.threads is not None and self.model.device.type == "cpu":
            state = f"; {step.governor.describe()}" if step.governor else ""
            explain_note(f"encode: {self.threads.describe()}{state}")
        if self.dtype_choice is not None:
            explain_note(f"encode: dtype auto: {self.dtype_choice}")
        elif getattr(self.model, "int8_speed", None) is not None:
            explain_note(f"encode: {self.dtype_reason}", once=True)
        if self.compile_choice is not None:
            explain_note(f"encode: compile: {self.compile_choice}", once=True)

    def _fill_tokens(self, batch_size: int, max_length: int) -> int:
        """The padded tokens a batch of short texts fills to past ``batch_size`` texts (the
        model's :meth:`~bertattn.encoder.model.BertModel.fill_tokens`; 0 for a model without
        it, and where a graph runner replays captured batch shapes)."""
        if self.graph_runner is not None and self.cuda_graphs:
            return 0
        fill = getattr(self.model, "fill_tokens", None)
        return fill(batch_size, max_length) if callable(fill) else 0

    def embed_encodings(
        self,
        encodings: Sequence[Any],
        *,
        pooling: str | None = None,
        normalize: bool | None = None,
    ) -> Tensor:
        """One batch of already tokenized inputs -> ``(B, E)`` float32 sentence embeddings on
        the CPU: the model step of :meth:`encode` (padding, the model, pooling, the folder's
        normalization), for callers that tokenize and batch themselves (the HTTP server).
        ``encodings``: ``tokenizers.Encoding`` objects from ``self.tokenizer.encode_batch``
        (or anything with ``ids``, ``type_ids``, ``tokens`` and ``overflowing``). Runs under
        ``torch.inference_mode()``; :func:`bertattn.engine.embedding_step` adds the thread
        governor for a caller that runs batches in a loop."""
        if isinstance(encodings, (str, bytes)) or not isinstance(encodings, Sequence):
            raise ArgumentTypeError(
                f"encodings must be a list of tokenizers.Encoding, got {describe(encodings)}."
            )
        if not encodings:
            raise ValueError("encodings is empty; give at least one tokenized input.")
        pooling = self.pooling_for(pooling)
        normalize = check_bool(normalize, "normalize", optional=True)
        normalize = self.normalize if normalize is None else normalize
        with torch.inference_mode():
            _, mask, hidden = self.forward_encodings(encodings)  # hidden (B, L, E)
            return self._sentences(hidden, mask, pooling, normalize, 0).cpu()

    def forward_encodings(self, encodings: Sequence[Any]) -> tuple[Any, Tensor, Tensor]:
        """One batch of tokenized inputs through the encoder: ``encodings`` (from
        :attr:`tokenizer`, e.g. ``bert.tokenizer.encode_batch(texts)``) padded to the longest
        and run as :meth:`encode` runs them (backend, CUDA graphs, dtype), without pooling.
        Returns ``(batch, mask, hidden)``: the padded batch (``input_ids``,
        ``attention_mask``, ``token_type_ids``: ``(B, L)`` on the CPU), the ``(B, L)``
        attention mask on the model's device and the ``(B, L, E)`` last hidden states. The
        heads and the server run their batches so; call it under ``torch.inference_mode()``."""
        device = self.model.device
        batch = self.tokenizer.pad(encodings)
        mask = batch.attention_mask.to(device)
        hidden = self._last_hidden(
            batch.input_ids.to(device), mask, batch.token_type_ids.to(device)
        )  # (B, L, E)
        return batch, mask, hidden

    #: the name the sentence-transformers surface (:mod:`.st_surface`) runs its rows by
    _forward = forward_encodings

    def _sentences(
        self, hidden: Tensor, mask: Tensor, pooling: str, normalize: bool, skip: int
    ) -> Tensor:
        """``(B, L, E)`` -> ``(B, E')`` float32: pooled over the real tokens (minus the first
        ``skip``: a prompt left out), through the folder's Dense modules (``E'``: the last
        one's width, else ``E``), L2-normalized when ``normalize``."""
        pool_mask = mask
        if skip:  # sentence-transformers' include_prompt=false
            pool_mask = mask.clone()
            pool_mask[:, :skip] = 0
        emb = pool(hidden, pool_mask, pooling).float()  # (B, E)
        for projection in getattr(self, "dense", ()):
            emb = projection(emb)  # (B, out_features)
        if normalize:
            emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        return emb

    def _last_hidden(self, ids: Tensor, mask: Tensor, types: Tensor) -> Tensor:
        """One padded batch through the model -> ``(B, L, E)``; replayed from a CUDA graph
        where :attr:`cuda_graphs` allows (on CUDA, or with an assigned :attr:`graph_runner`)."""
        runner = self.graph_runner
        if (
            runner is None
            and self.cuda_graphs
            and isinstance(self.model, BertModel)
            and self.model.device.type == "cuda"
            and families.get(self.model.config.family).can("cuda_graphs")
        ):
            runner = self.graph_runner = GraphedBert(self.model)
        if runner is not None and self.cuda_graphs:
            hidden = runner(ids, mask, types)
            logger.debug("batch %s: %s", tuple(ids.shape), runner.last_run)
            return hidden
        if self.compiled is not None:  # one graph: no per-call kernel choice to record
            return self.compiled(ids, mask, types)
        return self.model(ids, mask, types).last_hidden_state

    # ------------------------------------------------------------------ attention
    def attention_maps(
        self,
        text: str,
        pair: str | None = None,
        layers: Sequence[int] | None = None,
        *,
        max_length: int | None = None,
        qkv_layers: Sequence[int] = (),
    ) -> AttentionMaps:
        """Attention weights of one text (or text pair) as :class:`bertattn.AttentionMaps`.

        ``layers``: the layer indices to return (None = all); only those layers compute
        weights, the others run the fused backend. ``max_length``: tokens kept (default the
        model folder's setting; at most ``max_position_embeddings``). ``qkv_layers``: layers
        (among those returned) whose q / k / v projections go into ``maps.qkv``, for the page's
        step view (refused for MPNet: the page's recomputation has no relative position bias).
        """
        check_str(text, "text")
        check_str(pair, "pair", optional=True)
        limit = self._maps_limit(max_length)
        n = self.model.config.num_hidden_layers
        layers = None if layers is None else _layer_list(layers, "layers", n)
        qkv_layers = _layer_list(qkv_layers, "qkv_layers", n)
        batch = self.tokenizer([text], None if pair is None else [pair], max_length=int(limit))
        want = True if layers is None else list(layers)
        returned = range(n) if layers is None else list(layers)
        bad = [i for i in qkv_layers if i not in returned]
        if bad:
            raise ValueError(f"qkv_layers {bad} are not among the layers returned.")
        family = families.get(self.model.config.family)
        if qkv_layers and not family.can("steps"):
            raise ValueError(
                f"qkv_layers: the page's steps view recomputes softmax(q·k/√d_k + mask) from q, "
                f"k, v and has no step for {family.why_not('steps')}, so its numbers would be "
                f"wrong; write the page without steps (--steps), and use "
                f"Bert.attention_steps (bertattn attend --explain), which reads the values the "
                f"model computed."
            )
        if not want:
            raise ValueError("layers is empty; pass None for every layer or some layer indices.")
        top = int(batch.token_type_ids.max())
        if top >= self.model.config.type_vocab_size:  # a pair on a model with one token type
            config = "config.json" if self.folder is None else self.folder.config_path
            source = getattr(self.tokenizer, "source", None) or "the tokenizer"
            raise ModelFolderError(
                f"{config}: type_vocab_size={self.model.config.type_vocab_size}, but {source} "
                f"gives the second text of a pair token type {top}: this model takes no text "
                f"pairs. Call attention_maps without pair=, or use a model with "
                f"type_vocab_size >= {top + 1}."
            )
        device = self.model.device
        with torch.inference_mode(), record_steps() if qkv_layers else nullcontext() as rec:
            result = self.model(
                batch.input_ids.to(device),
                batch.attention_mask.to(device),
                batch.token_type_ids.to(device),
                output_attentions=want,
            )
        qkv = {}
        if rec is not None:  # one math call per returned layer, in layer order
            for i, r in zip(sorted(returned), rec.records, strict=True):
                if i in qkv_layers:
                    qkv[i] = {"q": r.q[0], "k": r.k[0], "v": r.v[0]}  # (H, L, D) each
        segment_start = None
        if pair is not None:
            types = batch.token_type_ids[0].tolist()
            segment_start = types.index(1) if 1 in types else None
        maps = AttentionMaps.from_model_output(
            batch.tokens[0],
            result.attentions or (),
            segment_start=segment_start,
            model_name=self.name,
        )
        if qkv:
            maps.qkv = {
                i: {k: t.float().numpy(force=True) for k, t in d.items()} for i, d in qkv.items()
            }
            maps.validate()
        return maps

    def _maps_limit(self, max_length: object) -> int:
        """:meth:`attention_maps`'s ``max_length`` checked (None: :attr:`max_length`)."""
        limit = self.max_length if max_length is None else max_length
        top_limit = self.model.config.max_position_embeddings
        if not is_int(limit):
            raise ArgumentTypeError(
                f"max_length must be an int in 2..{top_limit} or None, got {describe(limit)}."
            )
        if not 2 <= limit <= top_limit:  # type: ignore[operator]
            raise ValueError(
                f"max_length {limit!r} is out of range: this model takes 2..{top_limit} tokens."
            )
        return int(limit)  # type: ignore[arg-type]

    #: one head's steps (:func:`bertattn.encoder.steps.attention_steps`)
    attention_steps = _steps_view.attention_steps


def _fastest_dtype(
    folder: ModelFolder, target: torch.device | None, threads: int | None
) -> DtypeChoice:
    """``dtype="auto"``'s ``"fastest"`` meaning (:mod:`bertattn.dtypes`) for :meth:`Bert.load`:
    :func:`choose_dtype` on ``target`` (None: the CPU), timed at the model's widths and the
    thread count it will run at; logged with its reason."""
    widths = (folder.config.hidden_size, folder.config.intermediate_size)
    auto = choose_dtype(target or "cpu", threads=threads, widths=widths)
    logger.info("dtype auto on %s: %s", target or "cpu", auto)
    return auto


def _cut_and_normalize(emb: Tensor, truncate_dim: int | None, normalize: bool) -> Tensor:
    """``(B, E)`` sentence embeddings cut to their first ``truncate_dim`` dimensions (None:
    all), then L2-normalized when ``normalize`` (sentence-transformers' order)."""
    if truncate_dim is not None:
        emb = emb[:, :truncate_dim]
    return torch.nn.functional.normalize(emb, p=2, dim=1) if normalize else emb
