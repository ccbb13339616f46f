"""The one write policy (bertattn.files) at its edges: symlinked outputs, devices and pipes,
two spellings of one output; and reading a job's text from a pipe (jobs/inputs.py)."""

from __future__ import annotations

import errno
import os
import sys
import threading
from pathlib import Path

import pytest

from bertattn.errors import UsageError
from bertattn.files import check_output, overlapping, write_atomic, write_stdout
from bertattn.jobs.inputs import check_input


def test_an_output_symlink_is_written_through(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    target = real / "t.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert check_output(link) == target.resolve()
    write_atomic(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real"]
    assert sorted(p.name for p in real.iterdir()) == ["t.json"]  # no temporary file left


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "made.json")
    write_atomic(check_output(link), b"{}")
    assert link.is_symlink() and (tmp_path / "made.json").read_bytes() == b"{}"


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_devices_and_pipes_are_refused_as_outputs(make: str, tmp_path: Path) -> None:
    if make == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
    else:
        path = Path("/dev/null")
    with pytest.raises(UsageError, match="is not a regular file .* give a file name"):
        check_output(path, what="--json")
    assert path.exists() and not path.is_file()  # still the device / pipe


def test_a_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    with pytest.raises(UsageError, match=r"--json .*null\.json is not a regular file"):
        check_output(link, what="--json")


def test_overlapping_outputs(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    a = tmp_path / "a.json"
    assert overlapping([a, tmp_path / "sub" / ".." / "a.json"]) == (
        str(a),
        f"{tmp_path}/sub/../a.json",
    )
    (tmp_path / "l.json").symlink_to(a)  # a link to a file that does not exist yet
    assert overlapping([a, tmp_path / "l.json"]) is not None
    a.write_text("x")
    os.link(a, tmp_path / "hard.json")
    assert overlapping([tmp_path / "hard.json", a]) is not None
    assert overlapping(["-", "-", a, tmp_path / "b.json"]) is None  # stdout is not a file


def test_check_input_reads_a_pipe_only_when_streaming(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert check_input(pipe, what="--file", stream=True) == pipe
    with pytest.raises(UsageError, match="is not a regular file"):
        check_input(pipe, what="--onnx file")
    with pytest.raises(UsageError, match="does not exist"):
        check_input(tmp_path / "nothing", what="--file", stream=True)


def test_attend_reads_its_text_from_a_pipe(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def feed() -> None:
        with open(pipe, "w", encoding="utf-8") as f:
            f.write("the cat sat\n")

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    r = cli("attend", "--file", str(pipe), "--json", str(tmp_path / "a.json"), "-q")
    writer.join(5)
    assert r.code == 0, r
    assert '"the"' in (tmp_path / "a.json").read_text()


class _Stdout:
    """A stand-in for ``sys.stdout`` whose binary buffer writes with ``write``."""

    def __init__(self, write) -> None:  # type: ignore[no-untyped-def]
        self.buffer = self
        self.write = write

    def flush(self) -> None:
        pass


def _raise(exc: OSError):  # type: ignore[no-untyped-def]
    def write(data: bytes) -> int:
        raise exc

    return write


def test_a_failed_stdout_write_names_stdout(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``> file`` on a full disk."""
    monkeypatch.setattr(sys, "stdout", _Stdout(_raise(OSError(errno.ENOSPC, "No space left"))))
    with pytest.raises(OSError) as err:
        write_stdout(b"[1, 2]\n")
    assert err.value.filename == "<stdout>" and err.value.errno == errno.ENOSPC


def test_a_closed_pipe_stays_a_broken_pipe(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "stdout", _Stdout(_raise(BrokenPipeError(errno.EPIPE, "Broken"))))
    with pytest.raises(BrokenPipeError):
        write_stdout(lambda f: f.write(b"x"))


def test_verbose_says_what_was_loaded_and_written(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.txt").write_text("hello\nworld\n")
    r = cli("-v", "encode", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o.npy"))
    assert r.code == 0, r
    assert "bertattn.encoder: model " in r.err and " 6 layers, hidden 384, 12 heads" in r.err
    assert f"bertattn.files: wrote {tmp_path / 'o.npy'}" in r.err
    quiet = cli("encode", str(tmp_path / "a.txt"), "-o", str(tmp_path / "p.npy"))
    assert "bertattn.encoder" not in quiet.err and "bertattn.files" not in quiet.err


def test_a_short_write_is_completed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A raw write may take fewer bytes than given: the rest is written, nothing lost."""
    got = bytearray()

    def short(data: memoryview) -> int:
        got.extend(bytes(data[:1000]))
        return min(len(data), 1000)

    monkeypatch.setattr(sys, "stdout", _Stdout(short))
    data = bytes(range(256)) * 1000
    write_stdout(data)
    assert bytes(got) == data


def test_verbose_chunked_run_logs_each_line_once(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.txt").write_text("hello\nworld\n")
    r = cli("-v", "encode", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o.npy"), "--resumable")
    assert r.code == 0, r
    assert r.err.count("bytes in 1 chunks (0 done before), 1 rank(s)") == 1, r.err


def test_a_pipe_is_not_a_corpus_file(tmp_path: Path) -> None:
    """A corpus's files are read again (chunks, reruns, several inputs): a pipe cannot be one;
    the jobs read a lone pipe themselves, once (jobs.inputs.is_stream)."""
    from bertattn.corpus.sources import open_corpus
    from bertattn.jobs.inputs import is_stream

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(UsageError, match=r"is a pipe or a device, read once: it cannot be one"):
        open_corpus([tmp_path / "pipe", tmp_path / "pipe"])
    assert is_stream(pipe) and is_stream("-") and is_stream("/dev/null")
    assert not is_stream(tmp_path) and not is_stream(tmp_path / "missing.txt")


# ---------------------------------------------------------------------- long names (NAME_MAX)
def test_a_long_legal_name_is_written(tmp_path: Path) -> None:
    """244 characters: a legal name, whose temporary name ``.NAME.HOST-PID-XXXX.tmp`` would not
    be (over 255 bytes); the temporary name is cut and hashed, the output has its full name."""
    out = tmp_path / ("é" * 30 + "n" * 180 + ".json")  # 245 bytes: the cut falls inside an é
    assert check_output(out) == out
    write_atomic(out, b"{}")
    assert [p.name for p in tmp_path.iterdir()] == [out.name] and out.read_bytes() == b"{}"


def test_a_long_name_stale_temp_is_found_again(tmp_path: Path) -> None:
    """A temporary file a killed run left for a long name is recognised and removed."""
    from bertattn.files import _temp_path, remove_stale_temps

    out = tmp_path / ("n" * 240 + ".npy")
    stale = _temp_path(out)
    assert len(stale.name.encode()) <= 255
    dead = int(open("/proc/sys/kernel/pid_max").read()) + 1  # no process has it  # noqa: SIM115
    stale = stale.with_name(stale.name.replace(f"-{os.getpid()}-", f"-{dead}-"))
    stale.write_bytes(b"half")
    assert remove_stale_temps(out) == [stale] and not stale.exists()


def test_a_name_over_name_max_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"256 bytes long, over the filesystem's limit of 255"):
        check_output(tmp_path / ("n" * 251 + ".json"), suffixes=(".json",))
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- modes on overwrite
def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    """Overwriting keeps the existing file's mode (a private 0600 output stays private, a
    0640 one keeps its group read), as ``sed -i`` and editors do; a new file gets 0666 less
    the umask."""
    private, shared, new = tmp_path / "p.json", tmp_path / "s.json", tmp_path / "n.json"
    for path, mode in ((private, 0o600), (shared, 0o640)):
        path.write_bytes(b"old")
        path.chmod(mode)
    for path in (private, shared, new):
        write_atomic(path, b"new")
    assert private.stat().st_mode & 0o777 == 0o600
    assert shared.stat().st_mode & 0o777 == 0o640
    mask = os.umask(0)
    os.umask(mask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~mask
    assert all(p.read_bytes() == b"new" for p in (private, shared, new))


# ---------------------------------------------------------------------- the .lock of a folder
def test_a_finished_sharded_run_leaves_no_lock(tmp_path: Path, cli, tiny_checkpoint) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.txt").write_text("hello\nworld\n")
    r = cli("encode", tmp_path / "a.txt", "-o", f"{tmp_path / 'shards'}/", "--model",
            tiny_checkpoint, "-q")  # fmt: skip
    assert r.code == 0, r
    names = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert ".lock" not in names and "index.json" in names, names


def test_a_lock_removed_by_its_holder_is_not_held_by_a_late_opener(tmp_path: Path) -> None:
    """Process B opened ``.lock`` just before its holder A removed it and finished: B's lock
    on the removed file would not exclude C, who creates a new one; so B locks the file at the
    path, and C is then refused."""
    import fcntl

    from bertattn.files import FolderLock

    a = FolderLock(tmp_path, what="t").acquire()
    late = os.open(a.path, os.O_RDWR)  # B's open of the old file, before A removes it
    a.release(remove=True)
    assert not a.path.exists()
    fcntl.flock(late, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the removed file: anyone can lock it
    os.close(late)
    b = FolderLock(tmp_path, what="t").acquire()  # B, through acquire(): the file at the path
    with pytest.raises(UsageError, match="another bertattn run"):
        FolderLock(tmp_path, what="t").acquire()
    b.release()
    assert b.path.exists()  # not finished: the lock file stays


# ---------------------------------------------------------------------- lines without an end
class _Endless:
    """A binary stream of zeros without end (``/dev/zero``), that fails the test when it has
    given ``fail_after`` bytes (memory growing without bound otherwise)."""

    def __init__(self, fail_after: int) -> None:
        self.given, self.fail_after = 0, fail_after

    def read(self, n: int = -1) -> bytes:
        self.given += n
        assert self.given <= self.fail_after, "read on and on: no line-length limit"
        return b"\0" * n


def test_a_line_without_end_is_refused_at_the_limit() -> None:
    from bertattn.corpus.lines import MAX_LINE, stream_blocks

    stream = _Endless(fail_after=MAX_LINE + (8 << 20))
    with pytest.raises(ValueError) as err:
        list(stream_blocks(stream, "/dev/zero", jsonl=False))  # type: ignore[arg-type]
    assert str(err.value).startswith(
        "/dev/zero: line 1: longer than 64 MiB without a line end, the most bertattn reads"
    ), err.value
    assert MAX_LINE < stream.given <= MAX_LINE + (1 << 20)  # stopped right after the limit


def test_a_long_line_after_short_ones_is_named(tmp_path: Path) -> None:
    """The limit counts one line (not the file), and the error names its line number."""
    from bertattn.corpus.lines import _split

    pieces = [b"one\ntwo\n" + b"x" * 50, b"y" * 60, b"\nshort\n"]
    lines = _split(pieces, lambda n: f"f.txt: line {n}", limit=100)
    assert [next(lines)[0], next(lines)[0]] == [b"one", b"two"]
    with pytest.raises(ValueError, match=r"\Af\.txt: line 3: longer than 100 bytes without"):
        next(lines)
    assert [x for x, _ in _split(pieces, lambda n: "", limit=110)] == [
        b"one", b"two", b"x" * 50 + b"y" * 60, b"short"
    ]  # fmt: skip


@pytest.mark.slow  # a real process reads 64 MiB
def test_dev_zero_as_input_fails_in_one_line(tmp_path, cli_subprocess, tiny_checkpoint):  # type: ignore[no-untyped-def]
    r = cli_subprocess("encode", "/dev/zero", "-o", tmp_path / "o.npy", "--model",
                       tiny_checkpoint, timeout=60)  # fmt: skip
    assert r.code == 1 and "Traceback" not in r.err, r
    assert r.err.strip().splitlines()[-1].startswith(
        "bertattn encode: error: /dev/zero: line 1: longer than 64 MiB without a line end"
    ), r.err
    assert list(tmp_path.iterdir()) == []
