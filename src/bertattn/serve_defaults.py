"""The HTTP server's default limits, defined once: :class:`bertattn.serve.Limits` (what
:func:`bertattn.serve.create_app` takes) and :class:`bertattn.jobs.ServeOptions` (``bertattn
serve``) both take theirs from here. A module of its own, outside :mod:`bertattn.serve`, so
that the command line reads them without importing the server (starlette and uvicorn, the
optional ``bertattn[serve]`` extra)."""

from __future__ import annotations

__all__ = [
    "MAX_BATCH_TOKENS",
    "MAX_BODY_MIB",
    "MAX_DECODE_IDS",
    "MAX_QUEUE_S",
    "MAX_QUEUE_TOKENS",
    "MAX_REQUEST_INPUTS",
    "MIN_QUEUE_REQUESTS",
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
