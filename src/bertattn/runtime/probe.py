"""Measurements bertattn takes once per machine and keeps: a small JSON file in the user's cache
folder, so that a choice made by timing (``dtype="auto"``, :mod:`bertattn.encoder.auto_dtype`) is
the same in every later process on that machine, at that thread count, with that torch.

The file is ``CACHE/probes.json`` (``CACHE``: ``$BERTATTN_CACHE``, else
``$XDG_CACHE_HOME/bertattn``, else ``~/.cache/bertattn``; see :mod:`bertattn.models.cache`).
Each entry is keyed by what it measured and where (:func:`machine_key`: the CPU's model name,
torch's version, the thread count, and the shapes). ``bertattn bench --dispatch --remeasure``
forgets them and measures again (:func:`forget`); ``bertattn bench --dispatch`` prints the path.

Several processes may start at once (``encode --workers``, torchrun, a server's replicas):
the first to miss an entry takes a lock file (``probes.json.lock``, ``fcntl.flock``), reads
the file again, measures only if the entry is still missing, and writes the whole file to a
temporary name beside it, then renames it into place (``os.replace``), so a reader never sees
half a file and every process of a job reads the one measurement. Where the folder cannot be
written the measurement is used in this process only (logged). A file that is not valid UTF-8
JSON, or is not a regular file (a FIFO, a device such as ``/dev/zero``), or is larger than
:data:`MAX_BYTES`, is measured over and replaced (logged): it is opened without blocking, checked
with ``fstat`` and read at most :data:`MAX_BYTES` + 1 bytes, so nothing in its place can hang a
process or be read without bound.

``BERTATTN_DTYPE_PROBE`` (:func:`probing_enabled`): ``0``, ``false``, ``off``, ``no`` turn the
timing off (``dtype="auto"`` then follows the CPU's flags alone); unset, ``1``, ``true``,
``on``, ``yes``: on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from ..models.cache import cache_dir
from .cpu import cpu_name
from .switch import env_switch

__all__ = [
    "CACHE_FILE",
    "PROBE_ENV",
    "cache_path",
    "MAX_BYTES",
    "cached",
    "forget",
    "machine_key",
    "probing_enabled",
]

log = logging.getLogger(__name__)

#: the environment variable that turns the timed probes off
PROBE_ENV = "BERTATTN_DTYPE_PROBE"

#: the file's name in the cache folder
CACHE_FILE = "probes.json"
#: the layout of the file (an entry of another layout is measured again)
_FORMAT = 1
#: the largest file read as a probe cache (its entries take a few hundred bytes each); a larger
#: one is measured over and replaced
MAX_BYTES = 1 << 20
#: the longest a process waits for another's measurement before measuring on its own
_LOCK_WAIT_S = 30.0

_lock = threading.Lock()  # one measurement at a time in a process (flock is per process)


def probing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``BERTATTN_DTYPE_PROBE``: unset, empty, 1, true, on, yes (any case): the probes run; 0,
    false, off, no: they do not. Anything else raises :class:`~bertattn.errors.UsageError` (a
    ``ValueError``): a misspelt "off" must not mean on."""
    return env_switch(PROBE_ENV, "choose the dtype from the CPU's flags without timing", environ)


def cache_path() -> Path:
    """Where the measurements are kept: ``CACHE/probes.json`` (it need not exist yet)."""
    return cache_dir() / CACHE_FILE


def machine_key(kind: str, threads: int, **shape: object) -> str:
    """The key of one measurement: what (``kind``), the CPU's model name, torch's version, the
    thread count and the shapes timed, e.g. ``"dtype | AMD EPYC | torch 2.13.0+cpu | 2 threads
    | hidden=384 intermediate=1536 rows=256"``."""
    sizes = " ".join(f"{k}={v}" for k, v in sorted(shape.items()))
    return f"{kind} | {cpu_name()} | torch {torch.__version__} | {threads} threads | {sizes}"


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when there is no file; a :class:`ValueError` saying why when what
    is there is no cache file (not a regular file, or over :data:`MAX_BYTES`). Opened without
    blocking (a FIFO's open waits for a writer) and read at most ``MAX_BYTES + 1`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("is not a regular file")
        if info.st_size > MAX_BYTES:
            raise ValueError(f"has {info.st_size} bytes, over the {MAX_BYTES} a cache file has")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:  # grew while read
            raise ValueError(f"has over {MAX_BYTES} bytes")
        return data
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, dict]:
    """The file's entries (empty when there is no file, or it is not one this module wrote:
    then the caller measures and replaces it)."""
    try:
        data = _read_bytes(path)
    except ValueError as exc:
        log.warning("the probe cache %s %s; measuring again and replacing it", path, exc)
        return {}
    except OSError as exc:
        log.info(
            "cannot read the probe cache %s (%s: %s); measuring", path, type(exc).__name__, exc
        )
        return {}
    if data is None:
        return {}
    try:
        loaded = json.loads(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError too
        log.warning(
            "the probe cache %s is not valid JSON (or not UTF-8); measuring again and replacing "
            "it",
            path,
        )
        return {}
    if not isinstance(loaded, dict) or loaded.get("format") != _FORMAT:
        return {}
    entries = loaded.get("entries")
    return (
        {k: v for k, v in entries.items() if isinstance(v, dict)}
        if isinstance(entries, dict)
        else {}
    )


def forget(path: Path | None = None) -> bool:
    """Remove the cache file ``path`` (default :func:`cache_path`) under its lock, so that the
    next choice measures again; whether there was one. What is in its place is removed as a
    name (a FIFO or a link is not opened)."""
    path = cache_path() if path is None else path
    with _lock, _file_lock(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
    log.info("forgot the probe cache %s", path)
    return True


def _write(path: Path, entries: dict[str, dict]) -> None:
    """All of ``entries`` to ``path``: a temporary file beside it, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": _FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """Hold ``path.lock`` (``fcntl.flock``) while inside; yields False when it could not be
    taken (no ``fcntl``, a folder that cannot be written, or another process holding it for
    longer than :data:`_LOCK_WAIT_S`): the caller then measures on its own."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield False
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        held = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            except OSError:  # a file system without locks
                break
        try:
            yield held
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def cached(key: str, measure: Callable[[], dict], path: Path | None = None) -> tuple[dict, bool]:
    """The entry ``key`` of the cache file (``path``; default :func:`cache_path`), measured
    with ``measure()`` (a JSON-able dict) and written there when missing. Returns the entry and
    whether it was measured now. An exception from ``measure`` propagates (nothing is written)."""
    path = cache_path() if path is None else path
    return cached_in(path, key, measure, process_lock=_lock, file_name="the probe cache ")


def cached_in(
    path: Path,
    key: str,
    measure: Callable[[], dict],
    *,
    process_lock: contextlib.AbstractContextManager[object] | None = None,
    file_name: str = "",
) -> tuple[dict, bool]:
    """:func:`cached` for any file of the probe cache's format: read ``path``, then under its
    file lock (and ``process_lock``, when given) read again, measure only if ``key`` is still
    missing, write atomically. ``file_name``: what the log line calls the file before its
    path. Returns the entry and whether it was measured now."""
    entry = _read(path).get(key)
    if entry is not None:
        return entry, False
    with process_lock or contextlib.nullcontext(), _file_lock(path) as locked:
        entries = _read(path)  # another process may have measured while this one waited
        if key in entries:
            return entries[key], False
        entry = measure()
        if not locked:
            log.info("measuring %s without the lock on %s.lock", key, path)
        entries[key] = entry
        try:
            _write(path, entries)
        except OSError as exc:
            log.info(
                "cannot write %s%s (%s: %s): the measurement holds for this process only",
                file_name,
                path,
                type(exc).__name__,
                exc,
            )
        return entry, True
