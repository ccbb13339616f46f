"""The serve job: load the model, listen, answer HTTP until SIGTERM / Ctrl-C (options:
:class:`bertattn.jobs.ServeOptions`).

Checks before the model loads: the options (on construction), the optional packages
(``bertattn[serve]``), the device, the model folder and the token limits against it
(:mod:`bertattn.jobs.serve_checks`), and the port (bound first, so a port in use is one line,
not a traceback after a minute of loading)."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..engine import ModelStep, WrappedStep
from ..errors import JobError, MissingExtraError, UsageError
from .fields import job_device
from .serve_options import SERVE_MAX_CONNECTIONS, ServeOptions

logger = logging.getLogger("bertattn.serve")

__all__ = ["ServeResult", "run_serve"]

API_KEY_ENV = "BERTATTN_API_KEY"
WORKER_EXIT_S = 30.0  # seconds the end waits for the model worker's last batch
#: test hook, read here only: seconds each model batch is made slower (a slow model, for the
#: overload, timeout and drain tests that run a real server in a subprocess)
TEST_BATCH_DELAY_ENV = "BERTATTN_TEST_BATCH_DELAY"


@dataclass
class ServeResult:
    """How the server ended: the ``signal`` that stopped it (None: it stopped by itself) and
    whether the drain finished every request in flight."""

    signal: int | None
    drained: bool


class _Slowed(WrappedStep):
    """A step that sleeps before each batch (inside the batcher's timing: the speed it
    measures is the slow model's)."""

    def __init__(self, step: ModelStep, seconds: float) -> None:
        super().__init__(step)
        self._seconds = seconds

    @contextmanager
    def around(self) -> Iterator[None]:
        time.sleep(self._seconds)
        yield


def slowed(step: ModelStep, seconds: float) -> ModelStep:
    """Test hook: ``step``, each batch ``seconds`` slower (``$BERTATTN_TEST_BATCH_DELAY`` in
    :func:`run_serve`; an in-process test wraps its server's step so)."""
    return _Slowed(step, seconds) if seconds > 0 else step


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_extra() -> None:
    for module in ("starlette", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            raise MissingExtraError("bertattn serve", module, "serve") from None


def _listen(host: str, port: int) -> socket.socket:
    from ..serve.runner import listen

    try:
        return listen(host, port)
    except socket.gaierror as exc:
        raise UsageError(
            f"--host {host}: not an address of this machine ({exc.strerror})."
        ) from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise JobError(
            f"cannot listen on {host}:{port}: {why}; stop what uses that port or choose another "
            f"--port."
        ) from None


def _max_connections(given: int | None) -> int:
    """``--max-connections``, or the default: 1024, lowered to the soft open-file limit less 64
    (files the process needs besides connections), so that the cap is met before the process
    runs out of files and cannot even answer /live."""
    if given is not None:
        return given
    try:
        import resource

        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # not POSIX
        return SERVE_MAX_CONNECTIONS
    if files == resource.RLIM_INFINITY or files <= 0:
        return SERVE_MAX_CONNECTIONS
    return max(16, min(SERVE_MAX_CONNECTIONS, files - 64))


def _create_app(
    options: ServeOptions, bert: object, api_key: str | None, *, several: bool
) -> Any:
    """The ASGI app of the loaded model(s), with the options' limits (checked once more, by
    :class:`bertattn.serve.Limits`, as every library caller's are)."""
    from ..serve import create_app
    from ..serve.served import model_names

    # the names the model was given by, should its loaded name differ
    names = model_names(str(options.model)) if options.model and not several else ()
    return create_app(
        bert,
        one_worker=options.one_worker,
        max_batch_tokens=options.max_batch_tokens,
        max_queue_tokens=options.max_queue_tokens,
        max_queue_s=options.max_queue_time or None,
        min_queue_requests=options.min_queue_requests,
        max_request_inputs=options.max_request_inputs,
        max_decode_ids=options.max_decode_ids,
        max_input_tokens=options.max_input_tokens,
        truncate=options.truncate is not False,
        max_body_bytes=options.max_body_bytes,
        api_key=api_key,
        names=names,
        served_name=options.served_model_name,
    )


def _serving_line(state: object, sock: socket.socket, api_key: str | None) -> str:
    """The start-up line: what is served (each model, its kind unless an embedder), where,
    on which device and threads, and whether an API key is required."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    each = getattr(state, "states", [state])  # several models: a ServeGroup
    encoder = each[0].bert
    threads = "" if encoder.threads is None else f", {encoder.threads.describe()}"
    what = ", ".join(
        s.names[0] + ("" if s.served.record.default else f" ({s.served.describe()})")
        for s in each
    )
    return (
        f"serving {what} on http://{shown}:{port} ({encoder.device}{threads}; "
        f"{'API key required' if api_key else 'no API key'}); Ctrl-C or SIGTERM to stop"
    )


def run_serve(
    options: ServeOptions, *, announce: Callable[[str], object] | None = None
) -> ServeResult:
    """Serve until a signal; ``announce(line)`` gets the start-up and shut-down lines."""
    _check_extra()
    import uvicorn

    from ..encoder import Bert
    from ..serve.connections import guarded_protocol
    from ..serve.runner import DrainingServer

    say = announce or (lambda line: None)
    api_key = options.api_key or os.environ.get(API_KEY_ENV) or None
    device = job_device(options.device)
    from .serve_checks import check_before_load  # the folder and limits, before the weights

    folder = check_before_load(options)
    for other in options.models[1:]:  # every model's folder and limits, before any weights
        check_before_load(dataclasses.replace(options, model=other, one_worker=False))
    if not _is_local(options.host) and api_key is None:
        warnings.warn(
            f"--host {options.host} listens beyond this machine and no API key is set: anyone "
            f"who reaches the port can use it; set --api-key or {API_KEY_ENV}.",
            stacklevel=2,
        )
    sock = _listen(options.host, options.port)
    try:
        from ..heads.auto import load_auto  # an encoder, a reranker / classifier, SPLADE

        load = {"dtype": options.dtype, "device": device, "threads": options.threads}
        if options.task is not None:  # Jina v3's task adapters (an encoder's folder only)
            load["task"] = options.task
        models = [load_auto(m, sparse=options.sparse, **load) for m in options.models]
        bert = models if len(models) > 1 else models[0] if models else Bert.load(folder, **load)
        app = _create_app(options, bert, api_key, several=len(models) > 1)
        state = app.state.serve
        delay = float(os.environ.get(TEST_BATCH_DELAY_ENV, "0") or 0)
        for one in getattr(state, "states", [state]):  # before the workers start
            one.batcher.step = slowed(one.batcher.step, delay)
        protocol = guarded_protocol(
            state.metrics, options.header_timeout, _max_connections(options.max_connections)
        )
        config = uvicorn.Config(
            app,
            http=protocol,
            log_config=None,
            access_log=False,
            lifespan="on",
            server_header=False,
            timeout_graceful_shutdown=max(1, int(options.drain_timeout) or 1),
        )
        server = DrainingServer(config, state, options.drain_timeout)
        say(_serving_line(state, sock, api_key))
        try:
            server.run(sockets=[sock])
        finally:
            # the worker may still be inside a batch (a drain that timed out, a second signal):
            # let that batch end, or the interpreter's exit aborts torch's threads (SIGABRT)
            if not state.batcher.stop(WORKER_EXIT_S):
                logger.warning("the model worker did not stop within %g s", WORKER_EXIT_S)
    finally:
        sock.close()
    if server.signal is not None:
        name = signal.Signals(server.signal).name
        how = "every request in flight answered" if server.drained else "drain timed out"
        say(f"stopped on {name}: {how}")
    return ServeResult(server.signal, server.drained)
