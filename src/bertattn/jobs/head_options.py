"""The head jobs' options: :class:`RerankOptions` (``bertattn rerank``) and
:class:`PredictOptions` (``bertattn predict``), and what they share."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any

from ..choices import AGGREGATIONS, FUNCTIONS
from ..errors import UsageError
from .fields import (
    DEVICE_HELP,
    DTYPE_HELP,
    DTYPES,
    MAX_LENGTH_WHY,
    check_choice,
    check_device,
    check_dtype,
    check_int,
    check_text,
    option,
)

__all__ = ["HEAD_OUTPUTS", "PAIR_FLOOR", "PredictOptions", "RerankOptions"]

HEAD_OUTPUTS = (".jsonl",)
#: the shortest --max-length that keeps a token of each text of a pair, with BERT's template
#: ``[CLS] a [SEP] b [SEP]`` (a tokenizer that adds more is checked once the model is loaded)
PAIR_FLOOR = 5


def _head_common(cls: type, obj: Any) -> None:
    """What :class:`RerankOptions` and :class:`PredictOptions` check alike."""
    check_text(cls, obj, "input", optional=False)
    check_text(cls, obj, "output", optional=False)
    check_text(cls, obj, "model", optional=False)
    check_text(cls, obj, "field")
    check_device(cls, obj)
    check_dtype(cls, obj)
    check_int(cls, obj, "batch_size", optional=False)
    check_int(cls, obj, "max_length", low=3, because=MAX_LENGTH_WHY)
    check_int(cls, obj, "threads")
    check_int(cls, obj, "top_k")
    out = str(obj.output)
    if out != "-" and not out.lower().endswith(HEAD_OUTPUTS):
        raise UsageError(
            f"--output {out}: {cls.__name__.removesuffix('Options').lower()} writes JSON lines; "
            f"name the file .jsonl, or write - for stdout."
        )


_HEAD_INPUT = (
    "one text per line of a UTF-8 file, or a .jsonl file (--field names the text; default "
    "text); - for stdin"
)


_RUN = "running the model"


def _input(help: str, metavar: str) -> Any:
    """``-i/--input`` (required): the inputs, as ``help`` says, of either head job."""
    return option(MISSING, help, flags=("-i", "--input"), required=True, metavar=metavar)


def _model(help: str) -> Any:
    """``--model`` (required): the checkpoint folder or hub name ``help`` describes."""
    return option(MISSING, help, required=True, metavar="FOLDER")


def _output(help: str) -> Any:
    """``-o/--output``: the JSON lines ``help`` describes, to a .jsonl file or - (stdout,
    the default)."""
    return option(
        "-", f"{help} (default -: stdout)", flags=("-o", "--output"), metavar="OUT.jsonl"
    )


@dataclass(kw_only=True)
class _HeadRun:
    """How a head job runs its model: the options :class:`RerankOptions` and
    :class:`PredictOptions` share."""

    batch_size: int = option(
        32, "inputs per batch (rerank: query-document pairs; default 32)", type=int, group=_RUN
    )
    max_length: int | None = option(
        None, "tokens per input, a pair's together (default: the model's)", type=int, group=_RUN
    )
    dtype: str = option(
        "float32", f"compute dtype (default float32; {DTYPE_HELP})", choices=DTYPES, group=_RUN
    )
    device: str = option("auto", f"where the model runs: {DEVICE_HELP} (default auto)", group=_RUN)
    threads: int | None = option(
        None, "CPU threads (default: automatic)", type=int, metavar="N", group=_RUN
    )
    quiet: bool = option(False, "no summary line on stderr", flags=("-q", "--quiet"), group=_RUN)


@dataclass
class RerankOptions(_HeadRun):
    """``bertattn rerank``: documents ranked for a query by a one-label cross-encoder."""

    query: str = option(
        MISSING, "the query the documents are ranked for", positional=True, metavar="QUERY"
    )
    input: str = _input(f"the documents: {_HEAD_INPUT}", "DOCS")
    model: str = _model(
        "a BertForSequenceClassification folder with one label (a reranker), or a cached hub name"
    )
    output: str = _output(
        "JSON lines, best first, as bertattn.CrossEncoder.rank returns them: "
        '{"corpus_id": the document\'s 0-based record number, "id" (with --id-field), '
        '"score", "text" (with --return-documents)}'
    )
    field: str | None = option(None, "JSON field holding each document (default text)")
    id_field: str | None = option(
        None, 'JSON field holding each document\'s id, copied into the output as "id"'
    )
    top_k: int | None = option(None, "write the best K documents only (default: all)", type=int,
                               metavar="K")  # fmt: skip
    max_tokens_per_doc: int | None = option(
        None,
        "score a longer document in overlapping windows of N of its tokens and keep its best "
        "window (default: cut each query + document pair at the model's max length)",
        type=int,
        metavar="N",
    )
    return_documents: bool = option(False, 'include each document as "text"')

    def __post_init__(self) -> None:
        cls = type(self)
        if not isinstance(self.query, str) or not self.query.strip():
            raise UsageError("QUERY is empty; give the text the documents are ranked for.")
        _head_common(cls, self)
        check_int(  # below, every document would score the same: a pair cut to its specials
            cls,
            self,
            "max_length",
            low=PAIR_FLOOR,
            because="[CLS], [SEP], [SEP] and at least one token of the query and of the document",
        )
        check_text(cls, self, "id_field")
        check_int(cls, self, "max_tokens_per_doc")


@dataclass
class PredictOptions(_HeadRun):
    """``bertattn predict``: what a model's head says of each input, as bertattn.pipeline."""

    input: str = _input(
        f"the inputs: {_HEAD_INPUT}; for a sequence classifier a JSON line may carry "
        f'"text_pair" too (a text pair); for a masked LM each text holds [MASK]',
        "TEXTS",
    )
    model: str = _model(
        "a BertForSequenceClassification (text-classification), BertForTokenClassification "
        "(token-classification) or BertForMaskedLM (fill-mask) folder, or a cached hub name"
    )
    output: str = _output(
        "JSON lines, one per input, each the answer of bertattn.pipeline (transformers' "
        'dictionaries): {"label", "score"} (a list of them with --top-k), the entities '
        '[{"entity" or "entity_group", "score", "word", "start", "end", ...}], or the '
        'fill-mask proposals [{"score", "token", "token_str", "sequence"}]'
    )
    field: str | None = option(None, "JSON field holding each text (default text)")
    top_k: int | None = option(
        None,
        "a classifier: the best K labels as a list per input (default: the best one, not in a "
        "list); fill-mask: K proposals per [MASK] (default 5)",
        type=int,
        metavar="K",
    )
    function_to_apply: str | None = option(
        None,
        "a sequence classifier's scores: sigmoid, softmax or none (default: as transformers, "
        "from the model's problem_type and labels)",
        choices=FUNCTIONS,
    )
    aggregation_strategy: str | None = option(
        None,
        "a token classifier's entities: none (one per token, the default), simple, first, "
        "average or max (tokens grouped into words and entities)",
        choices=AGGREGATIONS,
    )

    def __post_init__(self) -> None:
        cls = type(self)
        _head_common(cls, self)
        check_choice(cls, self, "function_to_apply", FUNCTIONS)
        check_choice(cls, self, "aggregation_strategy", AGGREGATIONS)
