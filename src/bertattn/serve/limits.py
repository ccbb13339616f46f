"""The server's limits and settings: one frozen dataclass, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .. import serve_defaults as default

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """What :func:`bertattn.serve.create_app` accepts (keyword arguments of the same names).

    Tokens count [CLS] and [SEP]. ``max_batch_tokens``: real tokens per model batch;
    ``max_queue_tokens``: tokens admitted and not yet computed before new requests get 429;
    ``max_queue_s``: the same cap in seconds of work at the measured speed, whichever is less
    (None: tokens only), so that an admitted request waits about that long at most;
    ``min_queue_requests``: while fewer requests wait, the time cap does not apply (the token
    cap does), so that a burst of small requests is admitted;
    ``max_request_inputs``: inputs per request; ``max_decode_ids``: token ids in one ``/decode``
    request (a decode holds the GIL: /live waits for it); ``max_input_tokens``: tokens per input
    (None: the model's max length); ``truncate``: cut longer inputs (False: 400 naming the
    input); ``max_body_bytes``: request body size before 413; ``api_key``: the Bearer key the
    data routes require (None: open); ``body_timeout_s``: seconds a request body may take to
    arrive (then 408); ``max_wait_s``: how often, in seconds, the idle model worker looks at the
    queue again (requests take turns in batches: no input is starved); ``names``: extra model names
    the ``model`` field may carry (the served name is always accepted); ``served_name``:
    the name responses carry (default: the model's hub name, or its folder's name)."""

    max_batch_tokens: int = default.MAX_BATCH_TOKENS
    max_queue_tokens: int = default.MAX_QUEUE_TOKENS
    max_request_inputs: int = default.MAX_REQUEST_INPUTS
    max_decode_ids: int = default.MAX_DECODE_IDS
    max_input_tokens: int | None = None
    truncate: bool = True
    max_body_bytes: int = default.MAX_BODY_MIB << 20
    api_key: str | None = None
    max_wait_s: float = 0.5
    max_queue_s: float | None = default.MAX_QUEUE_S
    min_queue_requests: int = default.MIN_QUEUE_REQUESTS
    body_timeout_s: float = 30.0
    names: tuple[str, ...] = ()
    served_name: str | None = None

    def __post_init__(self) -> None:
        default.check_limits({f.name: getattr(self, f.name) for f in fields(self)})
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate must be True or False, got {self.truncate!r}.")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("api_key must be a non-empty str or None (no key: open routes).")
        wait = self.max_wait_s
        if not _seconds(wait):
            raise ValueError(f"max_wait_s must be a number of seconds >= 0, got {wait!r}.")
        cap = self.max_queue_s
        if cap is not None and (not _seconds(cap) or cap == 0):
            raise ValueError(f"max_queue_s must be a number of seconds > 0 or None, got {cap!r}.")
        if self.served_name is not None and (
            not isinstance(self.served_name, str) or not self.served_name.strip()
        ):
            raise ValueError(f"served_name must be a non-empty str, got {self.served_name!r}.")
        if isinstance(self.names, str) or not all(isinstance(n, str) for n in self.names):
            raise TypeError(f"names must be a tuple of str, got {self.names!r}.")


def _seconds(value: object) -> bool:
    """A finite number of seconds >= 0 (not a bool)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and value >= 0
    )
