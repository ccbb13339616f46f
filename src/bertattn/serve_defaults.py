"""The HTTP server's limits, defined once: their defaults and their checks.
:class:`bertattn.serve.Limits` (what :func:`bertattn.serve.create_app` takes) and
:class:`bertattn.jobs.ServeOptions` (``bertattn serve``) both take their defaults from here and
check their limits with :func:`check_limits` and :func:`check_model_length`, which name a limit
the way the caller spells it (:data:`KEYWORDS`: ``max_input_tokens=128``; the command line:
``--max-input-tokens 128``). A module of its own, outside :mod:`bertattn.serve`, so that the
command line reads them without importing the server (starlette and uvicorn, the optional
``bertattn[serve]`` extra)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "COUNTS",
    "KEYWORDS",
    "MAX_BATCH_TOKENS",
    "MAX_BODY_MIB",
    "MAX_DECODE_IDS",
    "MAX_LENGTH_WHY",
    "MAX_QUEUE_S",
    "MAX_QUEUE_TOKENS",
    "MAX_REQUEST_INPUTS",
    "MIN_QUEUE_REQUESTS",
    "Spelling",
    "check_limits",
    "check_model_length",
]

#: real tokens per model batch
MAX_BATCH_TOKENS = 16384
#: tokens admitted and not yet computed before new requests get 429
MAX_QUEUE_TOKENS = 16 * MAX_BATCH_TOKENS
#: inputs in one request (OpenAI's own cap on inputs per embeddings request)
MAX_REQUEST_INPUTS = 2048
#: token ids in one ``/decode`` request: the tokenizer holds Python's GIL while it decodes a
#: list (about 1 s a million ids), so every other request, /live included, waits that long
MAX_DECODE_IDS = 65536
#: largest request body, in MiB (``--max-body-size 16M``)
MAX_BODY_MIB = 16
#: seconds of queued work, at the measured speed, before new requests get 429
MAX_QUEUE_S = 2.0
#: while fewer requests wait, the time cap does not refuse a new one
MIN_QUEUE_REQUESTS = 128

#: the limits that are counts (positive ints); ``max_input_tokens`` may also be None
COUNTS = (
    "max_batch_tokens",
    "max_queue_tokens",
    "max_request_inputs",
    "max_body_bytes",
    "max_input_tokens",
    "max_decode_ids",
)
#: why a model input's length (``max_input_tokens``, ``--max-length``) is at least 3
MAX_LENGTH_WHY = "[CLS], [SEP] and at least one token of the text"


@dataclass(frozen=True)
class Spelling:
    """How a message names a limit (given by its :class:`bertattn.serve.Limits` field name):
    ``name(field)``, and ``between`` a name and its value (``max_batch_tokens=128``,
    ``--max-batch-tokens 128``)."""

    name: Callable[[str], str] = str
    between: str = "="

    def setting(self, field: str, value: object) -> str:
        """``field`` set to ``value``, as the caller writes it."""
        return f"{self.name(field)}{self.between}{value}"


#: the keyword arguments of :class:`bertattn.serve.Limits` and :func:`bertattn.serve.create_app`
KEYWORDS = Spelling()


def check_limits(limits: Mapping[str, object], spell: Spelling = KEYWORDS) -> None:
    """Raise ``ValueError`` (one line naming the limit as ``spell`` writes it, what came and the
    fix) for the first bad limit in ``limits`` (field names of :class:`bertattn.serve.Limits`;
    those absent are not checked): a count (:data:`COUNTS`) that is not a positive int, a
    ``min_queue_requests`` below 0, a ``max_input_tokens`` below 3 or above
    ``max_batch_tokens``, a ``max_queue_tokens`` below ``max_batch_tokens``."""
    for name in COUNTS:
        value = limits.get(name)
        if name not in limits or (value is None and name == "max_input_tokens"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{spell.name(name)} must be a positive int, got {value!r}.")
    floor = limits.get("min_queue_requests", 0)
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
        raise ValueError(
            f"{spell.name('min_queue_requests')} must be an integer >= 0, got {floor!r}."
        )
    given, batch = limits.get("max_input_tokens"), limits.get("max_batch_tokens")
    if isinstance(given, int) and given < 3:
        raise ValueError(
            f"{spell.name('max_input_tokens')} must be an integer >= 3, got {given} "
            f"({MAX_LENGTH_WHY})."
        )
    queue = limits.get("max_queue_tokens")
    if isinstance(queue, int) and isinstance(batch, int) and queue < batch:
        raise ValueError(
            f"{spell.setting('max_queue_tokens', queue)} is less than "
            f"{spell.setting('max_batch_tokens', batch)}: the queue could never fill one batch; "
            f"raise {spell.name('max_queue_tokens')} or lower {spell.name('max_batch_tokens')}."
        )
    if isinstance(given, int) and isinstance(batch, int) and given > batch:
        raise ValueError(
            f"{spell.setting('max_input_tokens', given)} is more than "
            f"{spell.setting('max_batch_tokens', batch)}: one input must fit in a batch."
        )


def check_model_length(
    max_input_tokens: int | None, max_batch_tokens: int, top: int, spell: Spelling = KEYWORDS
) -> int:
    """The tokens per input a model of max length ``top`` is served with (``max_input_tokens``,
    default ``top``); ``ValueError`` (one line, as :func:`check_limits`) when
    ``max_input_tokens`` is above ``top`` or ``max_batch_tokens`` below that length."""
    given = max_input_tokens
    if given is not None and given > top:
        raise ValueError(
            f"{spell.setting('max_input_tokens', given)} is more than the model takes ({top} "
            f"tokens); use {spell.setting('max_input_tokens', top)} or less."
        )
    longest = top if given is None else given
    if max_batch_tokens < longest:
        why = spell.name("max_input_tokens") if given is not None else "the model's max length"
        raise ValueError(
            f"{spell.setting('max_batch_tokens', max_batch_tokens)} is less than the longest "
            f"input, {longest} tokens ({why}): one input must fit in a batch; use "
            f"{spell.setting('max_batch_tokens', longest)} or more, or a lower "
            f"{spell.name('max_input_tokens')}."
        )
    return longest
