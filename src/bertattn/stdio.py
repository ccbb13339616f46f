"""Standard streams a process was started without (``<&-``, ``>&-``, ``2>&-``).

Python sets ``sys.stdin`` / ``sys.stdout`` / ``sys.stderr`` to None when the descriptor is
closed at start, and every use of one then fails with an ``AttributeError`` traceback. Worse,
the next file the process opens takes the free descriptor: a library writing to descriptor 1,
or a ``--workers`` rank inheriting it, would write into that file. :func:`mend_closed_streams`
(the command line, first thing) puts ``/dev/null`` on each closed descriptor and a
:class:`ClosedStream` in its place, whose data methods raise one ``OSError`` that says what
was closed; :func:`is_closed` lets a job refuse ``-`` before any work.

A stdout that fails (a full disk behind ``> file``, ``> /dev/full``) fails with an ``OSError``
that says only "No space left on device"; :class:`NamedStdout` (the command line wraps
``sys.stdout`` in it) gives that error the name ``<stdout>``, for every command's text.
"""

from __future__ import annotations

import errno
import os
import sys

__all__ = ["ClosedStream", "NamedStdout", "is_closed", "mend_closed_streams", "stdout_error"]

_REDIRECT = {0: "<&-", 1: ">&-", 2: "2>&-"}
_NAMES = {0: "stdin", 1: "stdout", 2: "stderr"}


class ClosedStream:
    """Stands in for a standard stream the process was started without: reading or writing
    raises ``OSError`` (EBADF) naming it; ``flush`` and ``close`` do nothing (nothing was
    written); ``buffer`` is itself."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.name = f"<{_NAMES[fd]}>"

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise OSError(
            errno.EBADF,
            f"{_NAMES[self.fd]} is closed (the command was started with {_REDIRECT[self.fd]}); "
            f"give it one, or use a file instead of -",
        )

    write = writelines = read = readline = readlines = readinto = fileno = _refuse

    @property
    def buffer(self) -> ClosedStream:
        return self

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    closed = False
    encoding = "utf-8"


def is_closed(stream: object) -> bool:
    """``stream`` (``sys.stdin`` ...) is missing: None, or a :class:`ClosedStream`."""
    return stream is None or isinstance(stream, ClosedStream)


def _descriptor_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def mend_closed_streams() -> None:
    """For each of stdin, stdout and stderr that is None (closed when the process started):
    ``/dev/null`` on its descriptor while it is still free, so no file opened later takes it,
    and a :class:`ClosedStream` in ``sys`` (stderr: a writer to ``/dev/null``, so that errors
    and warnings are dropped rather than sent to stdout by ``print(file=None)``)."""
    for fd, attr in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if getattr(sys, attr) is not None:
            continue
        if _descriptor_closed(fd):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if fd == 2:
            sys.stderr = open(fd, "w", closefd=False)  # noqa: SIM115 (the process's stderr)
        else:
            setattr(sys, attr, ClosedStream(fd))


def stdout_error(exc: OSError) -> OSError:
    """``exc`` (raised by writing stdout) as an ``OSError`` whose filename is ``<stdout>``;
    a ``BrokenPipeError`` (``| head``) stays itself, for the quiet exit 141."""
    if isinstance(exc, BrokenPipeError) or exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), "<stdout>")


class NamedStdout:
    """``sys.stdout`` whose write and flush errors name it (:func:`stdout_error`); anything
    else is the wrapped stream's (``buffer``, ``fileno``, ``isatty``, ``encoding`` ...)."""

    def __init__(self, stream: object) -> None:
        self.stream = stream

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)  # type: ignore[attr-defined, no-any-return]
        except OSError as exc:
            raise stdout_error(exc) from None

    def writelines(self, lines: object) -> None:
        for line in lines:  # type: ignore[attr-defined]
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()  # type: ignore[attr-defined]
        except OSError as exc:
            raise stdout_error(exc) from None
