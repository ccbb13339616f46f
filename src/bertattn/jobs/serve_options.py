"""``bertattn serve``'s options: :class:`ServeOptions` and its defaults (``SERVE_*``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import serve_defaults
from ..errors import UsageError
from ..runtime.threads import check_threads
from .fields import (
    DEVICE_HELP,
    ENCODER_DTYPE_HELP,
    ENCODER_DTYPES,
    TASK_HELP,
    check_device,
    check_dtype,
    check_int,
    check_seconds,
    check_text,
    check_unicode,
    flag,
    option,
    parse_size,
)

__all__ = [
    "SERVE_BATCH_TOKENS",
    "SERVE_BODY_SIZE",
    "SERVE_DECODE_IDS",
    "SERVE_DRAIN_TIMEOUT",
    "SERVE_FLAGS",
    "SERVE_HEADER_TIMEOUT",
    "SERVE_MAX_CONNECTIONS",
    "SERVE_MIN_QUEUE_REQUESTS",
    "SERVE_QUEUE_TIME",
    "SERVE_QUEUE_TOKENS",
    "SERVE_REQUEST_INPUTS",
    "ServeOptions",
]

#: ``bertattn serve`` defaults (tokens, inputs, bytes, seconds); those the library's
#: :class:`bertattn.serve.Limits` also has come from :mod:`bertattn.serve_defaults`
SERVE_BATCH_TOKENS = serve_defaults.MAX_BATCH_TOKENS
SERVE_QUEUE_TOKENS = serve_defaults.MAX_QUEUE_TOKENS
SERVE_REQUEST_INPUTS = serve_defaults.MAX_REQUEST_INPUTS
SERVE_DECODE_IDS = serve_defaults.MAX_DECODE_IDS
SERVE_BODY_SIZE = f"{serve_defaults.MAX_BODY_MIB}M"
SERVE_DRAIN_TIMEOUT = 30.0
SERVE_QUEUE_TIME = serve_defaults.MAX_QUEUE_S
SERVE_MIN_QUEUE_REQUESTS = serve_defaults.MIN_QUEUE_REQUESTS
SERVE_HEADER_TIMEOUT = 10.0
SERVE_MAX_CONNECTIONS = 1024

#: the limits :class:`ServeOptions` and :class:`bertattn.serve.Limits` share, by field name
_LIMITS = (
    "max_batch_tokens",
    "max_queue_tokens",
    "max_request_inputs",
    "max_decode_ids",
    "max_input_tokens",
    "min_queue_requests",
)
#: how ``bertattn serve``'s messages name a limit: by its flag (``--max-batch-tokens 128``)
SERVE_FLAGS = serve_defaults.Spelling(lambda name: flag(ServeOptions, name), " ")


@dataclass
class ServeOptions:
    """``bertattn serve``: sentence embeddings over HTTP (OpenAI's /v1/embeddings, TEI's /embed)."""

    model: str | None = option(
        None,
        "model folder or hub name (default MiniLM); give it again to serve several models in "
        "one process (an embedder and a reranker: each request goes to the model its body "
        "names, or to the one that answers its route)",
        action="append",
    )
    device: str = option("auto", f"where the model runs: {DEVICE_HELP} (default auto)")
    dtype: str = option(
        "float32",
        f"compute dtype (default float32; responses are float32; {ENCODER_DTYPE_HELP})",
        choices=ENCODER_DTYPES,
    )
    task: str | None = option(None, TASK_HELP, metavar="TASK")
    served_model_name: str | None = option(
        None,
        "the model name responses carry and requests may give (default: the hub name, e.g. "
        "sentence-transformers/all-MiniLM-L6-v2, or the folder's name; those stay accepted)",
        metavar="NAME",
    )
    host: str = option(
        "127.0.0.1",
        "address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every "
        "interface: set --api-key then)",
    )
    port: int = option(8080, "TCP port (default 8080; 0: any free port, printed)", type=int)
    threads: int | None = option(
        None,
        "CPU threads (default: the CPUs this process may use, lowered while other processes "
        "hold cores)",
        type=int,
        metavar="N",
    )
    max_batch_tokens: int = option(
        SERVE_BATCH_TOKENS,
        f"real tokens per model batch (default {SERVE_BATCH_TOKENS}); a larger request is "
        f"split across batches",
        type=int,
        metavar="N",
    )
    max_queue_tokens: int = option(
        SERVE_QUEUE_TOKENS,
        f"tokens waiting for the model before new requests get 429 + Retry-After (default "
        f"{SERVE_QUEUE_TOKENS})",
        type=int,
        metavar="N",
    )
    max_queue_time: float = option(
        SERVE_QUEUE_TIME,
        f"seconds of work (at the measured speed) that may wait before new requests get 429: "
        f"an admitted request waits about this long at most (default {SERVE_QUEUE_TIME:g}; "
        f"0: only --max-queue-tokens)",
        type=float,
        metavar="SECONDS",
    )
    min_queue_requests: int = option(
        SERVE_MIN_QUEUE_REQUESTS,
        f"while fewer requests than this wait, --max-queue-time does not refuse a new one "
        f"(--max-queue-tokens still does), so a burst of small requests gets in (default "
        f"{SERVE_MIN_QUEUE_REQUESTS}; 0: the time cap alone)",
        type=int,
        metavar="N",
    )
    max_request_inputs: int = option(
        SERVE_REQUEST_INPUTS,
        f"inputs in one request (default {SERVE_REQUEST_INPUTS})",
        type=int,
        metavar="N",
    )
    max_decode_ids: int = option(
        SERVE_DECODE_IDS,
        f"token ids in one POST /decode request: decoding holds the interpreter, so /live and "
        f"every other request wait for it (default {SERVE_DECODE_IDS})",
        type=int,
        metavar="N",
    )
    max_input_tokens: int | None = option(
        None,
        "tokens per input, [CLS] and [SEP] included (default: the model's max length)",
        type=int,
        metavar="N",
    )
    truncate: bool | None = option(
        None,
        "cut a longer input to --max-input-tokens (default); --no-truncate answers 400 naming "
        "the input instead",
    )
    sparse: bool = option(
        False,
        "serve a plain BertForMaskedLM folder as SPLADE (POST /embed_sparse); a "
        "sentence-transformers folder with SpladePooling is served so without it",
    )
    max_body_size: str = option(
        SERVE_BODY_SIZE,
        f"largest request body: 512K, 16M, ... (default {SERVE_BODY_SIZE}); larger gets 413",
        metavar="SIZE",
    )
    api_key: str | None = option(
        None,
        "require 'Authorization: Bearer KEY' on the data routes and /info (default: "
        "$BERTATTN_API_KEY; none: open). Probes and /metrics stay open",
        metavar="KEY",
    )
    drain_timeout: float = option(
        SERVE_DRAIN_TIMEOUT,
        f"on SIGTERM / Ctrl-C, seconds to finish the requests in flight (default "
        f"{SERVE_DRAIN_TIMEOUT:.0f}); /ready answers 503 meanwhile",
        type=float,
        metavar="SECONDS",
    )
    header_timeout: float = option(
        SERVE_HEADER_TIMEOUT,
        f"seconds a connection may take to send a request's headers, counted from when it "
        f"opens or its last answer (default {SERVE_HEADER_TIMEOUT:g}); then it is closed (408 "
        f"when part of a request came)",
        type=float,
        metavar="SECONDS",
    )
    max_connections: int | None = option(
        None,
        f"open connections at most; more get 503 and are closed (default "
        f"{SERVE_MAX_CONNECTIONS}, lowered to the open-file limit less 64)",
        type=int,
        metavar="N",
    )
    one_worker: bool = option(
        False,
        "with several --model: run their batches one at a time on one worker, in the order "
        "they were formed (default: a worker per model)",
    )
    quiet: bool = option(
        False,
        "no start-up and shut-down lines on stderr (warnings and errors still appear)",
        flags=("-q", "--quiet"),
    )

    def __post_init__(self) -> None:
        cls = type(self)
        given = self.model
        many = isinstance(given, (list, tuple))
        #: every --model, in order (``model`` is the first)
        self.models: tuple[str, ...] = tuple(given) if many else (() if given is None else (given,))
        self.model = self.models[0] if self.models else None
        for one in self.models:
            if not isinstance(one, (str, os.PathLike)) or not str(one).strip():
                raise UsageError(f"--model must be a non-empty path or name, got {one!r}.")
        if self.one_worker and len(self.models) < 2:
            raise UsageError(
                "--one-worker shares one worker between several models; give --model more "
                "than once, or drop --one-worker."
            )
        if len(self.models) > 1 and self.served_model_name is not None:
            raise UsageError(
                "--served-model-name names one model; with several --model each is served "
                "under its own names (the folder's name and path, or the hub name)."
            )
        if len(self.models) > 1 and self.task is not None:
            raise UsageError(
                "--task merges one task adapter into one model; serve the model with adapters "
                "on its own (one --model) to pick its task."
            )
        check_text(cls, self, "served_model_name")
        check_text(cls, self, "task")
        check_unicode(cls, self, "served_model_name", "host", "api_key")
        check_device(cls, self)
        check_dtype(cls, self, int8=True)
        if not isinstance(self.host, str) or not self.host.strip() or " " in self.host:
            raise UsageError(f"--host must be an address such as 127.0.0.1, got {self.host!r}.")
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise UsageError(f"--port must be an integer in 0..65535, got {port!r}.")
        check_int(cls, self, "threads")
        check_threads(self.threads, flag(cls, "threads"))
        self._check_limits()
        if self.truncate is not None and not isinstance(self.truncate, bool):
            raise UsageError(f"truncate must be True, False or None, got {self.truncate!r}.")
        self.max_body_bytes  # noqa: B018  (parses --max-body-size)
        if self.api_key is not None and (
            not isinstance(self.api_key, str) or not self.api_key.strip()
        ):
            raise UsageError("--api-key is empty; give a key, or drop --api-key.")
        check_seconds(cls, self, "drain_timeout")
        check_seconds(cls, self, "max_queue_time")
        check_seconds(cls, self, "header_timeout")
        if self.header_timeout == 0:
            raise UsageError("--header-timeout must be a number of seconds > 0, got 0.")
        check_int(cls, self, "max_connections")

    def _check_limits(self) -> None:
        """The limits :class:`bertattn.serve.Limits` also has, by its one check (named by flag)."""
        given = {name: getattr(self, name) for name in _LIMITS}
        try:
            serve_defaults.check_limits(given, SERVE_FLAGS)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    @property
    def max_body_bytes(self) -> int:
        """``--max-body-size`` in bytes."""
        return parse_size(self.max_body_size, "--max-body-size")
