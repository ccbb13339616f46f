"""How many CPU threads bertattn computes with: one policy, one owner.

Two parts:

* :func:`cpu_budget` / :func:`choose_threads`: the threads a process may really use. That is the
  CPUs it may run on (``os.sched_getaffinity``: ``taskset``, ``docker --cpuset-cpus``), capped by
  the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``: ``docker
  --cpus``, Kubernetes CPU limits), rounded up. An explicit count (``Bert.load(threads=N)``,
  ``--threads N``) wins, then ``OMP_NUM_THREADS``; a count the user gave torch themselves
  (``torch.set_num_threads``) is left alone.
* :class:`ThreadGovernor`: keeps throughput when other processes take cores. PyTorch's OpenMP
  pool splits every operation across all its threads and waits at a barrier; when another
  process holds a core, each barrier waits for a descheduled thread, and a 2-core machine with
  one busy neighbour runs ~3x slower than with one thread. The governor times batches (seconds
  per token) and, when the process's threads were seen waiting for a CPU (the kernel's
  per-thread run-queue delay, ``/proc/self/task/*/schedstat``), tries one batch at fewer
  threads; it keeps the count that measures faster and now and then tries one rung back up.
  On a quiet machine it costs two reads of ``/proc`` per probe interval and nothing else.

The library never changes torch's thread count behind a user's back: the governor only runs
inside bertattn's own batch loops (``Bert.encode``, the jobs, the server), restores the count it
found when a loop ends, and stays off when the count is fixed (explicit, ``OMP_NUM_THREADS``, or
set by the user).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .switch import env_switch

logger = logging.getLogger("bertattn.runtime.threads")

__all__ = [
    "CpuBudget",
    "ThreadChoice",
    "ThreadGovernor",
    "check_threads",
    "choose_threads",
    "cpu_budget",
    "max_threads",
    "split_threads",
]

#: set to 0 to keep the policy's count without the governor: the same rounding whatever the load
#: (the count a batch runs at changes the order of float sums: rows differ by ~1e-7)
ADAPTIVE_ENV = "BERTATTN_ADAPTIVE_THREADS"

#: threads per CPU of the machine bertattn runs at most (and never fewer than ``_MIN_CAP``)
_PER_CPU = 8
_MIN_CAP = 64

#: the count bertattn itself last gave torch (so that it is not mistaken for the user's own)
_ours: int | None = None


@dataclass(frozen=True)
class CpuBudget:
    """What the process may use: ``affinity`` CPUs to run on, and a cgroup ``quota`` in CPUs
    (None: no quota) read from ``quota_file``."""

    affinity: int
    quota: float | None = None
    quota_file: str | None = None

    @property
    def cpus(self) -> int:
        """Threads worth running: the affinity, capped by the quota rounded up (>= 1)."""
        n = self.affinity
        if self.quota is not None:
            n = min(n, math.ceil(self.quota - 1e-9))
        return max(1, n)

    def describe(self) -> str:
        """E.g. ``"2 CPUs in affinity, cgroup quota 1.5 CPUs (/sys/fs/cgroup/cpu.max)"``."""
        text = f"{self.affinity} CPU{'s' if self.affinity != 1 else ''} in affinity"
        if self.quota is None:
            return text + ", no CPU quota"
        return text + f", cgroup quota {self.quota:g} CPUs ({self.quota_file})"


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_paths(proc: Path) -> tuple[str | None, str | None]:
    """The process's cgroup v2 path and its v1 ``cpu`` controller path, from ``/proc/self/cgroup``
    (lines ``hierarchy:controllers:path``)."""
    v2 = v1 = None
    for line in (_read(proc / "self" / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _ancestors(root: Path, path: str) -> Iterator[Path]:
    """``root/path`` and each parent folder up to ``root`` (a quota anywhere above applies)."""
    parts = [p for p in path.split("/") if p and p != ".."]
    for n in range(len(parts), -1, -1):
        yield root.joinpath(*parts[:n])


def _quota_v2(root: Path, path: str) -> tuple[float, str] | None:
    best: tuple[float, str] | None = None
    for folder in _ancestors(root, path):
        text = _read(folder / "cpu.max")
        fields = (text or "").split()
        if len(fields) != 2 or fields[0] == "max":
            continue
        try:
            quota = int(fields[0]) / int(fields[1])
        except (ValueError, ZeroDivisionError):
            continue
        if quota > 0 and (best is None or quota < best[0]):
            best = (quota, str(folder / "cpu.max"))
    return best


def _quota_v1(root: Path, path: str) -> tuple[float, str] | None:
    best: tuple[float, str] | None = None
    for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
        base = root / mount
        if not base.is_dir():
            continue
        for folder in _ancestors(base, path):
            quota_text = _read(folder / "cpu.cfs_quota_us")
            period_text = _read(folder / "cpu.cfs_period_us")
            try:
                quota = int(quota_text or "") / int(period_text or "")
            except (ValueError, ZeroDivisionError):
                continue
            if quota > 0 and (best is None or quota < best[0]):  # -1: no quota
                best = (quota, str(folder / "cpu.cfs_quota_us"))
        break
    return best


def cpu_budget(
    *,
    proc: str | Path = "/proc",
    cgroup: str | Path = "/sys/fs/cgroup",
    affinity: int | None = None,
) -> CpuBudget:
    """The CPUs this process may use: its affinity and the tightest cgroup CPU quota on its
    cgroup path (v2 first, then v1). ``proc`` / ``cgroup`` / ``affinity`` are for tests."""
    proc, cgroup = Path(proc), Path(cgroup)
    count = _affinity() if affinity is None else affinity
    v2, v1 = _cgroup_paths(proc)
    found = None
    if v2 is not None and (cgroup / "cgroup.controllers").exists():
        found = _quota_v2(cgroup, v2)
    if found is None and v1 is not None:
        found = _quota_v1(cgroup, v1)
    if found is None:
        return CpuBudget(count)
    return CpuBudget(count, quota=found[0], quota_file=found[1])


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count chosen, where it came from, and whether the governor may lower it
    under co-located load (``adaptive``)."""

    threads: int
    source: str
    adaptive: bool
    budget: CpuBudget
    users: bool = False  # the user's own torch count: bertattn does not touch it

    def describe(self) -> str:
        """One line for ``-v``, ``bench`` and logs."""
        mode = "adaptive under load" if self.adaptive else "fixed"
        return f"{self.threads} thread{'s' if self.threads != 1 else ''} ({self.source}; {mode})"


def max_threads() -> int:
    """The most threads bertattn computes with: 8 per CPU of the machine (``os.cpu_count()``,
    the host's CPUs, not the affinity: a pinned process may still oversubscribe on purpose),
    and at least 64. More only adds waits at OpenMP's barriers, and far more fails to start
    (``torch.set_num_threads(10**9)`` kills the interpreter)."""
    return max(_MIN_CAP, _PER_CPU * (os.cpu_count() or 1))


def _cap_text(cap: int) -> str:
    cpus = os.cpu_count() or 1
    return f"at most {cap} ({_PER_CPU} per CPU of this machine's {cpus}, at least {_MIN_CAP})"


def check_threads(threads: object, name: str = "threads") -> int | None:
    """``threads`` as given when it is None or an int in ``1..max_threads()``; otherwise a
    :class:`~bertattn.errors.UsageError` (a ``ValueError``) naming ``name`` (the argument or
    the command-line flag), the value, the bound and the fix."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise UsageError(f"{name} must be a positive int or None (the policy), got {threads!r}.")
    cap = max_threads()
    if threads > cap:
        raise UsageError(
            f"{name} {threads} is more threads than bertattn runs: {_cap_text(cap)}; give "
            f"{cpu_budget().cpus} (the CPUs this process may use) or leave it unset."
        )
    return threads


def _env_threads(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """``OMP_NUM_THREADS`` as ``(count, source)`` (None: unset or not a positive int, as
    OpenMP ignores it), clamped to :func:`max_threads` with a warning: the variable is often
    set by a platform rather than by the user, so a process is not refused for it."""
    text = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    try:
        value = int(text)
    except ValueError:
        return None
    if value < 1:
        return None
    cap = max_threads()
    if value > cap:
        warnings.warn(
            f"OMP_NUM_THREADS={value} is more threads than bertattn runs: {_cap_text(cap)}; "
            f"using {cap}. Set OMP_NUM_THREADS to the CPUs this process may use, or unset it.",
            stacklevel=3,
        )
        return cap, f"OMP_NUM_THREADS={value}, clamped to {cap}"
    return value, f"OMP_NUM_THREADS={value}"


def adaptive_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``BERTATTN_ADAPTIVE_THREADS``: unset, empty, 1, true, on, yes (any case): the governor
    runs; 0, false, off, no: it does not. Anything else raises
    :class:`~bertattn.errors.UsageError` (a ``ValueError``): a misspelt "off" must not mean on."""
    return env_switch(ADAPTIVE_ENV, "keep a fixed thread count", environ)


def choose_threads(
    threads: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    budget: CpuBudget | None = None,
    current: int | None = None,
) -> ThreadChoice:
    """The policy. ``threads``: an explicit count (a positive int, at most
    :func:`max_threads`: more raises :class:`~bertattn.errors.UsageError`, a ``ValueError``)
    or None. In order:

    1. an explicit count: used as given, fixed;
    2. ``OMP_NUM_THREADS`` in the environment: fixed (torchrun and ``--workers`` set it per rank);
       more than :func:`max_threads` is clamped to it, with a warning;
    3. a count the user set with ``torch.set_num_threads`` (torch's count differs from the
       affinity and from what bertattn set): left alone, fixed;
    4. otherwise the budget's CPUs (affinity capped by the cgroup quota), adaptive unless
       ``BERTATTN_ADAPTIVE_THREADS`` says off (:func:`adaptive_enabled`: a value it does not
       know raises ``UsageError``).

    ``current`` is torch's count now (read from torch when None)."""
    check_threads(threads)
    environ = os.environ if environ is None else environ
    adaptive = adaptive_enabled(environ)  # a bad value is refused whatever else is given
    budget = cpu_budget() if budget is None else budget
    if threads is not None:
        return ThreadChoice(threads, "explicit", False, budget)
    env = _env_threads(environ)
    if env is not None:
        return ThreadChoice(env[0], env[1], False, budget)
    if current is None:
        import torch

        current = torch.get_num_threads()
    if current not in (budget.affinity, _ours):
        source = "set with torch.set_num_threads, left alone"
        return ThreadChoice(current, source, False, budget, users=True)
    source = budget.describe() + ("" if adaptive else f"; {ADAPTIVE_ENV}=0")
    return ThreadChoice(budget.cpus, source, adaptive, budget)


def apply(choice: ThreadChoice) -> None:
    """Give torch the chosen count (only when it is bertattn's to set: not a user's own)."""
    global _ours
    import torch

    if choice.users:
        return
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    _ours = choice.threads
    logger.info("threads: %s", choice.describe())


def split_threads(total: int, ranks: int) -> int:
    """Threads for each of ``ranks`` local processes sharing ``total`` (>= 1 each)."""
    return max(1, total // max(1, ranks))


def _rungs(top: int) -> list[int]:
    """Counts the governor may pick, descending: top, top-1, 3/4, 1/2, 1/4, ... of top, 1."""
    counts = {top, top - 1, math.ceil(top * 3 / 4)}
    n = top
    while n > 1:
        n = math.ceil(n / 2)
        counts.add(n)
    counts.add(1)
    return sorted((c for c in counts if c >= 1), reverse=True)


class RunDelay:
    """Cumulative run-queue delay (ns) of the threads that compute for the calling thread's
    loop, from the kernel's schedstat; ``None`` where it cannot be read (not Linux, no
    schedstat). The process's other Python threads are left out (``others``: their native
    ids; default: every live Python thread but the caller): a server's event loop or a
    tokenizing thread waiting for a core while this loop's OpenMP threads compute is this
    process's own work, not another process taking cores; OpenMP's threads (not Python
    threads) and the caller count."""

    def __init__(
        self, proc: str | Path = "/proc", others: Callable[[], set[int]] | None = None
    ) -> None:
        self.tasks = os.path.join(str(proc), "self", "task")
        self.others = _other_python_threads if others is None else others

    def total(self) -> int | None:
        try:
            names = os.listdir(self.tasks)
        except OSError:
            return None
        skip = self.others()
        delay = 0
        for name in names:
            if name.isdigit() and int(name) in skip:
                continue
            try:
                with open(f"{self.tasks}/{name}/schedstat", "rb") as f:
                    fields = f.read().split()
                delay += int(fields[1])
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended, or no schedstat
        return delay


#: the name every chunk worker's thread starts with (bertattn.runtime.workers): the model's own
#: compute, so its waits for a CPU count like the OpenMP threads'
CHUNK_WORKER_PREFIX = "bertattn-chunks-"


def _other_python_threads() -> set[int]:
    """Native ids of the live Python threads other than the calling one and the chunk
    workers."""
    me = threading.get_native_id()
    return {
        t.native_id
        for t in threading.enumerate()
        if t.native_id is not None
        and t.native_id != me
        and not t.name.startswith(CHUNK_WORKER_PREFIX)
    }


@dataclass
class GovernorStats:
    """What the governor did: batches timed, probes tried, switches made, and batches left at
    the full count because they balance their own work (``balanced``)."""

    batches: int = 0
    probes: int = 0
    switches: int = 0
    balanced: int = 0


#: a look (and so a down-probe) comes at most once every this many batches (doubling with the
#: seconds while probes lose): a probe at half the threads can cost a whole batch, so with long
#: batches (paragraphs, ~1 s each) a look every 0.2 s would probe at every batch
LOOK_BATCHES = 4


class ThreadGovernor:
    """Adapts the intra-op thread count to the cores that are really free, by measurement.

    Use :meth:`batch` around each unit of work of a loop, ``work`` its size (tokens). Two kinds
    of probe, each one batch at another count:

    * down (fewer threads): when a look (at most every ``look_s`` seconds and every
      :data:`LOOK_BATCHES` batches, both doubling while probes lose, up to ``max_look_s`` and
      ``max_interval``) finds that this process's threads waited for a CPU (run-queue delay
      above ``contention`` of wall time x threads), or at every look where that cannot be
      read. One rung down first, one rung further after each loss (with many cores and a few
      taken, N-1 threads can be as stuck at the barriers as N);
    * up (more threads, when below the top): every ``interval`` batches, 2 doubling to
      ``max_interval`` while probes lose, and at once when a batch of a size not yet seen at
      this count comes (other work: what held for short texts may not hold for paragraphs).

    Costs per unit of work are compared within a size class (batches within a power of two of
    each other): a loop that alternates a full batch and a short rest judges each probe against
    its own size. Never worse than no governor (which runs the top count): a down-probe is held
    against the mean of the batches of its size either side at the current count and must be
    ``margin`` (10%) cheaper twice in a row before the count drops, while an up-probe switches
    back when it is no dearer than the batch of its size before it, so a lucky batch cannot
    hold a slower count.
    """

    def __init__(
        self,
        top: int,
        *,
        min_interval: int = 2,
        max_interval: int = 64,
        look_s: float = 0.2,
        max_look_s: float = 12.8,
        margin: float = 0.1,
        contention: float = 0.1,
        run_delay: RunDelay | None = None,
    ) -> None:
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ValueError(f"top must be a positive int, got {top!r}.")
        self.rungs = _rungs(top)
        self.level = 0
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.min_look_s = look_s
        self.max_look_s = max_look_s
        self.margin = margin
        self.contention = contention
        self.stats = GovernorStats()
        self._busy = threading.Lock()
        self._delay = RunDelay() if run_delay is None else run_delay
        self._interval = min_interval
        self._countdown = min_interval
        self._look_s = look_s
        self._down_step = 1  # rungs a down-probe skips: grows while down-probes lose
        self._confirm: int | None = None  # a level whose down-probe won once: probe it again
        self._depth = 0  # loops entered and not left
        self._left: tuple[float, int | None] | None = None  # (time, delay) the last loop ended
        # (cost per unit, work) at the current count, per size class of batch (_size_class)
        self._refs: dict[int, tuple[float, int]] = {}
        self._probe: tuple[int, float, float, int] | None = None  # (level, ref cost, cost, work)
        self._waits = 0  # batches since the probe that could not judge it (another size)
        self._look_batches = LOOK_BATCHES  # and at least this many batches between looks
        self._since_look = 0  # batches since the last look
        self._mark: tuple[float, int | None] = (time.perf_counter(), self._delay.total())

    def __getstate__(self) -> dict:
        """A copy or pickle keeps the rungs and settings, not the lock (locks do not pickle)
        nor the measurements (they describe this process's run, not the copy's)."""
        state = dict(self.__dict__)
        for name in ("_busy", "_refs", "_probe", "_mark", "_confirm", "_depth", "_left"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild what :meth:`__getstate__` dropped: a fresh lock, no reference, no probe."""
        self.__dict__.update(state)
        self._busy = threading.Lock()
        self._refs = {}
        self._probe = None
        self._waits = 0
        self._confirm = None
        self._depth = 0
        self._left = None
        self._mark = (time.perf_counter(), self._delay.total())

    @property
    def threads(self) -> int:
        """The count the governor runs at now."""
        return self.rungs[self.level]

    def describe(self) -> str:
        """E.g. ``"governor at 1 of 2 threads after 116 batches (6 probes, 1 switch)"``."""
        s = self.stats

        def n(count: int, word: str) -> str:
            return f"{count} {word}{'' if count == 1 else ('es' if word.endswith('ch') else 's')}"

        side = f"; {n(s.balanced, 'batch')} balanced at {self.rungs[0]}" if s.balanced else ""
        return (
            f"governor at {self.threads} of {self.rungs[0]} threads after "
            f"{n(s.batches, 'batch')} ({n(s.probes, 'probe')}, {n(s.switches, 'switch')}){side}"
        )

    def _waited(self, now: float) -> bool:
        """Whether this process's threads waited for a CPU since the last look (True where
        that cannot be read)."""
        delay = self._delay.total()
        then, before = self._mark
        self._mark = (now, delay)
        self._since_look = 0
        if delay is None or before is None or now <= then:
            return True
        share = (delay - before) / 1e9 / ((now - then) * self.threads)
        return share > self.contention

    def _plan(self, work: int) -> int:
        """The level for the coming batch of ``work``."""
        ref = self._ref_for(work)
        if self._probe is not None or ref is None:
            return self.level
        self._countdown -= 1
        now = time.perf_counter()
        probe = None
        if self._confirm is not None:
            probe = self._confirm
        elif (
            self.level + 1 < len(self.rungs)
            and now - self._mark[0] >= self._look_s
            and self._since_look >= self._look_batches
            and self._waited(now)
        ):
            probe = min(self.level + self._down_step, len(self.rungs) - 1)
        elif self.level > 0 and self._countdown <= 0:
            probe = self.level - 1
        if probe is None:
            return self.level
        self.stats.probes += 1
        self._probe = (probe, ref[0], math.nan, work)
        return probe

    def _settle(self, plevel: int, won: bool) -> None:
        """After a judged probe: reset the waits on a switch, else back off that kind."""
        if won and plevel > self.level:  # down: look again soon, in case the load moves on
            self._interval, self._look_s = self.min_interval, self.min_look_s
            self._look_batches = LOOK_BATCHES
            self._down_step = 1
        elif won:  # back up: the looks keep their back-off (the last drop may have been luck)
            self._interval = self.min_interval
        elif plevel > self.level:  # a lost down-probe: look less often, and further down
            self._look_s = min(self._look_s * 2, self.max_look_s)
            self._look_batches = min(self._look_batches * 2, self.max_interval)
            self._down_step = 1 if plevel == len(self.rungs) - 1 else self._down_step + 1
        else:
            self._interval = min(self._interval * 2, self.max_interval)
        self._countdown = self._interval

    def _comparable(self, work: int, ref_work: int) -> bool:
        return ref_work / 2 <= work <= ref_work * 2

    @staticmethod
    def _size_class(work: int) -> int:
        """Batches within a power of two of each other share a reference: a loop that
        alternates sizes (a full batch of paragraphs, then the short rest) judges each probe
        against batches of its own size, never a 5x larger one."""
        return max(work, 1).bit_length()

    def _ref_for(self, work: int) -> tuple[float, int] | None:
        """The reference cost at the current count for a batch of ``work`` (None: none yet)."""
        size = self._size_class(work)
        for key in (size, size - 1, size + 1):
            ref = self._refs.get(key)
            if ref is not None and self._comparable(work, ref[1]):
                return ref
        return None

    def _set_ref(self, cost: float, work: int) -> None:
        """A batch at the current count is the reference for its size. A size not seen at this
        count below the top brings the next up-probe near: the looks and probes so far were
        about other work (short texts), and what holds for them may not for this."""
        size = self._size_class(work)
        if size not in self._refs and self._refs and self.level > 0:
            self._interval = self.min_interval
            self._countdown = 0  # probe up at the next batch of a size with a reference
        self._refs[size] = (cost, work)

    def _record(self, level: int, cost: float, work: int) -> None:
        probe = self._probe
        if probe is None:
            self._set_ref(cost, work)
            return
        plevel, before, pcost, pwork = probe
        up = plevel < self.level
        if level == plevel and math.isnan(pcost):  # the probe batch itself
            self._waits = 0
            if not up:  # a down-probe waits for the batch after it (below)
                self._probe = (plevel, before, cost, work)
                return
            # up (towards what no governor runs): judged at once against the batch before
            pcost, pwork, reference = cost, work, before
        else:  # a batch at the current count after a down-probe: judged if of its size
            self._set_ref(cost, work)
            if not self._comparable(work, pwork):
                self._waits += 1
                if self._waits > 8:  # no batch of that size comes back: not judged, try again
                    self._probe = None
                    self._countdown = 2
                return
            reference = (before + cost) / 2
        self._probe = None
        # fewer threads must win by the margin, twice in a row; more threads (what no governor
        # runs) only must not lose: a lucky batch cannot keep a slower count (never worse)
        down = not up
        won = pcost < reference * (1 - self.margin) if down else pcost <= reference
        if won and down and self._confirm != plevel:
            self._confirm = plevel
            self._countdown = 0
            return
        self._confirm = None
        if won:
            logger.info(
                "threads: %d -> %d (%.3g vs %.3g us per unit of work)",
                self.threads,
                self.rungs[plevel],
                reference * 1e6,
                pcost * 1e6,
            )
            self.stats.switches += 1
            self._refs = {self._size_class(pwork): (pcost, pwork)}  # the old count's are stale
        self._settle(plevel, won)
        if won:
            self.level = plevel

    @contextmanager
    def batch(self, work: int, *, balanced: bool = False) -> Iterator[int]:
        """Run one unit of work of size ``work`` (> 0) at the governed count; yields the count.
        A batch that starts while another is running (two threads encoding at once) runs
        ungoverned at torch's current count: its timing would mix both. ``balanced``: the
        batch balances its own work across the threads (a model's chunk workers take the next
        chunk as they finish, :mod:`bertattn.runtime.workers`), so no barrier waits for a busy
        core: it runs at the top count, neither probed nor taken as a reference."""
        import torch

        if not self._busy.acquire(blocking=False):
            yield torch.get_num_threads()
            return
        try:
            if balanced:
                n = self.rungs[0]
                if torch.get_num_threads() != n:
                    torch.set_num_threads(n)
                self.stats.balanced += 1
                yield n
                return
            with self._governed(work) as n:
                yield n
        finally:
            self._busy.release()

    @contextmanager
    def _governed(self, work: int) -> Iterator[int]:
        import torch

        level = self._plan(work)
        n = self.rungs[level]
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        start = time.perf_counter()
        yield n
        elapsed = time.perf_counter() - start
        self.stats.batches += 1
        self._since_look += 1
        if work > 0 and elapsed > 0:
            self._record(level, elapsed / work, work)

    @contextmanager
    def loop(self) -> Iterator[ThreadGovernor]:
        """Around a batch loop: torch's thread count is restored when it ends. The time and the
        run-queue delay between two loops are left out of the next look: what the process did
        meanwhile (another model's work, a tokenizing pool that spins after its call) is not
        contention of this loop's threads, and probing for it cost ~20% of a quiet encode."""
        import torch

        before = torch.get_num_threads()
        self._depth += 1
        if self._depth == 1 and self._left is not None:
            (then, before_delay), (left_at, left_delay) = self._mark, self._left
            now, delay = time.perf_counter(), self._delay.total()
            if before_delay is None or left_delay is None or delay is None:
                self._mark = (then + (now - left_at), None)
            else:
                self._mark = (then + (now - left_at), before_delay + (delay - left_delay))
            self._left = None
        try:
            yield self
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._left = (time.perf_counter(), self._delay.total())
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)
