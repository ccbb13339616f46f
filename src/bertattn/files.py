"""Writing outputs: the one policy for every file bertattn writes.

A leaf (imports nothing of the package), so the library layers (viz, deploy, distributed) and
the jobs all write through it:

* **atomic**: the bytes go to a temporary file in the output's own folder, are flushed and
  fsync'ed, then renamed over the output. A reader sees the old file or the new one, never half.
* **the mode a plain ``open()`` gives** to a new file: ``0o666`` less the umask (``0644`` under
  umask 022, ``0600`` under 077), not the ``0600`` of ``mkstemp``; a file that is replaced
  keeps its own mode (as ``sed -i`` and editors keep it: a private ``0600`` output stays so).
* **checked before the work** (:func:`check_output`): an output that is a folder or a device,
  pipe or socket, that sits in a missing or unwritable folder, or that is one of the job's
  inputs (also through a symlink or a hard link) is refused with a
  :class:`~bertattn.errors.UsageError` before anything is computed; :func:`overlapping` finds
  two outputs that are one file.
* **through symlinks**: an output that is a symlink replaces the file it points to; the link
  stays.
* **no leftovers**: a temporary file is removed on every exit path (errors, Ctrl-C, SIGTERM once
  the CLI turns it into ``SystemExit``). Temporary names carry the host and process id
  (``.NAME.HOST-PID-XXXX.tmp``), so one left by a killed run (SIGKILL, power loss) is recognised
  and removed by the next run on that host. A temporary name fits in the folder's name limit
  (``NAME_MAX``, 255 bytes): a long ``NAME`` is cut and ends in a hash of the whole name; an
  output name over the limit is refused by :func:`check_output`.
* **all or none** (:func:`write_all`): a job with several outputs writes every temporary file
  first and renames only when all are complete.
* :class:`FolderLock`: an exclusive, non-blocking ``flock`` on a folder, released by the kernel
  when its process dies (used for a resumable run's parts folder); the holder removes its
  ``.lock`` file when the run finished (``release(remove=True)``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import socket
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

from .errors import UsageError

__all__ = [
    "HOST",
    "FolderLock",
    "Payload",
    "check_name_length",
    "check_output",
    "file_mode",
    "name_max",
    "overlapping",
    "process_alive",
    "remove_stale_temps",
    "same_file",
    "stale_temps",
    "write_all",
    "write_atomic",
    "write_stdout",
]

#: what a writer gets: bytes, or a function that writes into an open binary file
Payload = bytes | Callable[[BinaryIO], object]

logger = logging.getLogger("bertattn.files")

#: this host, as it stands in a temporary file's name (letters, digits and ``_``; 40 at most)
HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:40] or "host"
_TEMP = re.compile(r"\A\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]+\.tmp\Z")


def file_mode() -> int:
    """``0o666`` less the process umask: the mode ``open(path, "w")`` would create."""
    try:  # Linux: read it without changing it (os.umask is process-wide and racy)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


#: the longest file name (bytes) when the filesystem does not say (Linux's NAME_MAX)
NAME_MAX = 255


def name_max(folder: str | os.PathLike[str]) -> int:
    """The longest file name, in bytes, that ``folder``'s filesystem takes (``NAME_MAX``)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX


def check_name_length(path: str | os.PathLike[str], *, what: str = "output") -> None:
    """Refuse (:class:`UsageError`) a file name longer than its folder's filesystem takes,
    before any work: writing it would fail only at the end (``File name too long``)."""
    path = Path(path)
    size = len(os.fsencode(path.name))
    limit = name_max(path.parent if path.parent.is_dir() else ".")
    if size > limit:
        raise UsageError(
            f"{what} {path}: the file name is {size} bytes long, over the filesystem's limit of "
            f"{limit} bytes per name (NAME_MAX); choose a shorter name."
        )


def _temp_stem(name: str) -> str:
    """``name`` as it appears in a temporary name: whole when ``.NAME.HOST-PID-XXXXXXXX.tmp``
    fits in :data:`NAME_MAX` bytes, else cut (a character cut in two is dropped) and ended
    with ``~`` and a hash of the whole name, so that a long output name still has one."""
    room = NAME_MAX - len(f"..{HOST}-{2**22}-{'0' * 8}.tmp")
    raw = os.fsencode(name)
    if len(raw) <= room:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return f"{raw[: room - len(digest) - 1].decode('utf-8', 'ignore')}~{digest}"


def _temp_path(path: Path) -> Path:
    stem = _temp_stem(path.name)
    return path.with_name(f".{stem}.{HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's live process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def stale_temps(folder: Path, name: str) -> list[Path]:
    """The temporaries ``.NAME.HOST-PID-XXXXXXXX.tmp`` in ``folder`` that this host's processes
    made for ``name`` and whose process is gone (none when ``folder`` cannot be listed)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for entry in names:
        m = _TEMP.match(entry)
        mine = m is not None and m["name"] == name and m["host"] == HOST
        if mine and not process_alive(int(m["pid"])):  # type: ignore[index]
            found.append(folder / entry)
    return found


def remove_stale_temps(path: str | os.PathLike[str]) -> list[Path]:
    """Remove this host's temporary files for ``path`` whose process is gone; return them."""
    path = Path(path)
    removed = []
    for stale in stale_temps(path.parent, _temp_stem(path.name)):
        try:
            stale.unlink()
            removed.append(stale)
        except OSError:
            pass
    return removed


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name the same existing file (symlinks followed, hard links found)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(
    path: str | os.PathLike[str],
    *,
    what: str = "output",
    inputs: Iterable[str | os.PathLike[str]] = (),
    suffixes: Sequence[str] | None = None,
) -> Path:
    """Refuse, before any work, an output that cannot be written; return it as a ``Path``.

    Raises :class:`UsageError` when ``path`` is a folder or another non-regular file (a device,
    a pipe), is one of ``inputs``, has a suffix outside ``suffixes``, a name longer than the
    filesystem takes (``NAME_MAX``), or its folder is missing or not writable (probed by
    creating and removing a temporary file there, so read-only filesystems and permissions
    are both caught). Also removes the temporary files a dead
    earlier run left for ``path``. A symlink is followed: the returned path is its target,
    which the writers replace, so the link stays (as ``open(path, "w")`` would keep it).
    """
    flag = f"{what} {path}"
    check_name_length(path, what=what)  # first: a longer name fails every look at the path
    out = _through_link(Path(path))
    if out.is_dir():
        raise UsageError(f"{flag} is a folder; give a file name inside it.")
    if out.exists() and not out.is_file():
        raise UsageError(
            f"{flag} is not a regular file (a device, pipe or socket); bertattn replaces an "
            f"output whole, so give a file name (or - for stdout where the option takes it)."
        )
    for source in inputs:  # first: the worst mistake, named as such
        if str(source) != "-" and same_file(out, source):
            raise UsageError(
                f"{flag} is the input file {source}; writing it would destroy the input: "
                f"choose another output name."
            )
    if suffixes is not None and not out.suffix and out.name.lower() in suffixes:
        raise UsageError(
            f"{flag}: {out.name} is only a suffix; give a name before it (out{out.name})."
        )
    if suffixes is not None and out.suffix.lower() not in suffixes:
        raise UsageError(
            f"{flag}: unknown format {out.suffix or '(no suffix)'!r}; the format is taken from "
            f"the suffix: use {' or '.join(suffixes)}."
        )
    folder = out.parent
    if not folder.is_dir():
        raise UsageError(
            f"{flag}: the folder {folder} does not exist; create it first (mkdir -p {folder})."
        )
    probe = _temp_path(out)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(
            f"{flag}: cannot write in the folder {folder} ({exc.strerror or exc}); choose an "
            f"output in a folder you can write to."
        ) from None
    remove_stale_temps(out)
    return out


def _through_link(path: Path) -> Path:
    """``path``, or the file a symlink at ``path`` points to (followed to the end): an output
    written through a link replaces the target, not the link."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def overlapping(paths: Iterable[str | os.PathLike[str]]) -> tuple[str, str] | None:
    """The first two of ``paths`` that name the same file (after ``..``, symlinks and hard
    links), or None; ``"-"`` (stdout) is not a file."""
    seen: list[tuple[str, str]] = []
    for p in paths:
        if str(p) == "-":
            continue
        real = os.path.realpath(p)
        for q, q_real in seen:
            if real == q_real or same_file(real, q_real):
                return q, str(p)
        seen.append((str(p), real))
    return None


def _mode_for(path: Path) -> int:
    """The mode the written file gets: the mode of the file it replaces, or a plain
    ``open()``'s for a new one (:func:`file_mode`)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return file_mode()


def _write_temp(path: Path, data: Payload) -> Path:
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_all(items: Sequence[tuple[str | os.PathLike[str], Payload]]) -> list[Path]:
    """Write several files atomically and all together: every temporary file is complete before
    the first rename, so a failure while writing leaves none of the outputs (and no temporary
    files). Returns the paths in order. ``OSError`` messages name the output, not the temp."""
    temps: list[tuple[Path, Path]] = []
    try:
        for path, data in items:
            out = _through_link(Path(path))
            try:
                temps.append((_write_temp(out, data), out))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot write {out}: {exc.strerror or exc}") from None
        for tmp, out in temps:
            os.replace(tmp, out)
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)  # no-op for the ones already renamed
    for folder in {out.parent for _, out in temps}:
        _sync_folder(folder)
    for _, out in temps:
        logger.info("wrote %s", out)
    return [out for _, out in temps]


#: bytes per write of :func:`write_stdout`
_STDOUT_CHUNK = 1 << 16


def write_stdout(data: Payload) -> None:
    """Write ``data`` to stdout (binary, after flushing the text layer) and flush.

    Bytes go out in 64 KiB pieces until all are written: one large write to a pipe whose reader
    goes away part way (``| head``) can come back short instead of failing, which would lose
    the rest silently; the next piece raises. A closed pipe stays a ``BrokenPipeError``, which
    the command line turns into a quiet exit 141; any other failure names stdout (``OSError``
    with filename ``<stdout>``: a full disk behind ``> file`` says where it could not write)."""
    sys.stdout.flush()
    out = sys.stdout.buffer
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            view = memoryview(data).cast("B")
            while view:
                n = out.write(view[:_STDOUT_CHUNK])
                if n == 0:
                    raise BrokenPipeError(errno.EPIPE, "stdout takes no more bytes")
                view = view[min(len(view), _STDOUT_CHUNK) if n is None else n :]
        else:
            data(out)
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), "<stdout>") from None


def write_atomic(path: str | os.PathLike[str], data: Payload) -> Path:
    """Write one file atomically (see the module docstring); return its path."""
    return write_all([(path, data)])[0]


class FolderLock:
    """An exclusive lock on ``folder`` (a ``.lock`` file inside it), taken without waiting.

    ``acquire()`` raises :class:`UsageError` naming the holder's pid when another process holds
    it. The kernel drops the lock when the holder exits, however it exits. ``release(remove=
    True)`` (a run that finished) removes the ``.lock`` file first, while still holding it; a
    process that opened the file just before is not fooled: ``acquire()`` holds a lock only
    on the file that is still at the path, and tries again otherwise.
    """

    NAME = ".lock"

    def __init__(self, folder: str | os.PathLike[str], *, what: str) -> None:
        self.path = Path(folder) / self.NAME
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise UsageError(
                        f"another bertattn run (process {holder}) is writing {self.what}; wait "
                        f"for it to finish or stop it, or choose another output."
                    ) from None
                raise
            if self._still_there(fd):
                break
            os.close(fd)  # removed by the holder that just finished: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{HOST}:{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def _still_there(self, fd: int) -> bool:
        try:
            at_path = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def release(self, *, remove: bool = False) -> None:
        """Drop the lock; ``remove``: delete the ``.lock`` file too (the run finished)."""
        if self._fd is not None:
            if remove:
                self.path.unlink(missing_ok=True)  # still held: no one else holds this file
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
