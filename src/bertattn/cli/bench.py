"""`bertattn bench`: the module-level benchmark (the rest: `make bench`); `--dispatch`: the
attention dispatch policy table in use (`--measure`: re-measured on this machine, short), and
the files where this machine's timed choices are kept (`--remeasure`: forgotten and timed
again now); `--encode`: texts per second of a model's encode in each dtype this CPU offers,
and what `--dtype auto` picks here and why. Progress goes to stderr as it runs.

Every option is checked before any work (exit 2, one line): ``--repeats`` and ``--cases`` >= 1,
``--threads`` >= 0, the ``--json`` file writable (:func:`bertattn.files.check_output`).
``--json -`` puts the JSON on stdout and the human-readable lines on stderr; the ``wrote``
status line goes to stderr, as for the other commands.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TextIO

PROG = "bertattn bench"

log = logging.getLogger("bertattn.bench")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per peer (default 5)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (default 0: torch's own choice)"
    )
    p.add_argument(
        "--cases", type=int, default=None, help="run only the first N cases (default: all)"
    )
    p.add_argument(
        "--json", help="also write the results to this JSON file (-: to stdout, table to stderr)"
    )
    p.add_argument(
        "--dispatch",
        action="store_true",
        help="print the attention dispatch policy table `auto` uses, instead of timing",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="with --dispatch: re-measure the candidates here (quick, ~1 min) and print the "
        "table they give; the table in use is not changed (python -m benchmarks.dispatch "
        "regenerates it)",
    )
    p.add_argument(
        "--encode",
        action="store_true",
        help="time Bert.encode (texts/s) of --model in each dtype this CPU offers, and say "
        "what --dtype auto picks here and why",
    )
    p.add_argument(
        "--model",
        default=None,
        help="with --encode: a model folder or name (default: the default model)",
    )
    p.add_argument(
        "--texts", type=int, default=256, help="with --encode: texts per round (default 256)"
    )
    p.add_argument(
        "--remeasure",
        action="store_true",
        help="with --dispatch: forget this machine's kept timings (the dtype probe of "
        "--dtype auto, the float32 product libraries) and time them again now",
    )


def _check_options(args: argparse.Namespace) -> Path | None:
    """Refuse, before any work, options that cannot work; return the ``--json`` file (None:
    none, or ``-`` for stdout). A ``--cases`` above the number of cases runs them all."""
    from ..errors import UsageError
    from ..files import check_output

    for flag in ("measure", "remeasure"):
        if getattr(args, flag) and not args.dispatch:
            raise UsageError(
                f"--{flag} goes with --dispatch (bertattn bench --dispatch --{flag})"
            )
    if args.encode and args.dispatch:
        raise UsageError("--encode and --dispatch are two benchmarks; give one of them.")
    if args.model is not None and not args.encode:
        raise UsageError("--model goes with --encode (bertattn bench --encode --model FOLDER)")
    if args.texts < 1:
        raise UsageError(f"--texts must be an integer >= 1, got {args.texts}.")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be an integer >= 1, got {args.repeats}.")
    if args.cases is not None and args.cases < 1:
        from ..bench.module import DEFAULT_CASES

        raise UsageError(
            f"--cases must be an integer >= 1, got {args.cases} (there are "
            f"{len(DEFAULT_CASES)} cases; drop --cases to run them all)."
        )
    if args.threads < 0:
        raise UsageError(
            f"--threads must be an integer >= 1 (or 0 for torch's default), got {args.threads}."
        )
    from ..runtime.threads import check_threads

    check_threads(args.threads or None, "--threads")  # not more than bertattn runs
    out = None
    if args.json is not None and args.json != "-":
        if not args.json.strip():
            raise UsageError(f"--json must be a file name (or - for stdout), got {args.json!r}.")
        out = check_output(args.json, what="--json", suffixes=(".json",))
    from ..runtime.threads import cpu_budget

    budget = cpu_budget()
    if args.threads > budget.cpus:
        log.warning(
            "--threads %d: this process may use %s; the timings will be oversubscribed.",
            args.threads,
            budget.describe(),
        )
    return out


def run(args: argparse.Namespace) -> int:

    from ..runtime.threads import apply, choose_threads

    out = _check_options(args)
    apply(choose_threads(args.threads or None))
    # --json -: stdout holds the JSON alone; the human-readable lines go to stderr
    human = sys.stderr if args.json == "-" else sys.stdout
    if args.dispatch:
        data = _dispatch(args, human)
    elif args.encode:
        data = _encode(args, human)
    else:
        data = _module(args, human)
    _write_json(data, out, to_stdout=args.json == "-")
    return 0


def _module(args: argparse.Namespace, human: TextIO) -> dict[str, object]:
    from ..bench import environment
    from ..bench.module import DEFAULT_CASES, format_module_table, run_module_bench

    cases = DEFAULT_CASES if args.cases is None else DEFAULT_CASES[: args.cases]
    _progress("measuring the machine (the dtype probe and the product libraries, once)")
    env = environment()
    print("module benchmark: E=768 H=12, eval, need_weights=False", file=human)
    print(_environment_line(env), file=human)
    print(_cpu_line(env), file=human)
    _progress(
        f"timing {len(cases)} case{'s' * (len(cases) != 1)} x {args.repeats} rounds against "
        f"the article's class, torch and transformers (about 10 s a case)"
    )
    results = run_module_bench(cases, repeats=args.repeats, progress=_progress)
    print(format_module_table(results), file=human)
    return {"environment": env, "module": results}


def _progress(line: str) -> None:
    """A progress line on stderr, as the benchmark runs."""
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _environment_line(env: dict[str, object]) -> str:
    """Where the numbers are measured, in words: torch, threads, CPUs, the processor."""
    cuda = f"; CUDA: {env['cuda']}" if env.get("cuda") else ""
    return (
        f"on: {env['processor']} ({env['machine']}), {env['usable_cpus']}, "
        f"{env['threads']} torch threads; torch {env['torch']}{cuda}"
    )


def _encode(args: argparse.Namespace, human: TextIO) -> dict[str, object]:
    from ..bench import environment
    from ..bench.encode import as_json, auto_choice, format_encode_table, run_encode_bench

    _progress("measuring the machine (the dtype probe and the product libraries, once)")
    env = environment()
    name = args.model or "the default model (all-MiniLM-L6-v2)"
    print(f"encode benchmark: {name}, {args.texts} texts a round (6-40 tokens), batch 32, "
          f"median of {args.repeats} rounds", file=human)  # fmt: skip
    print(_environment_line(env), file=human)
    results = run_encode_bench(
        args.model, texts=args.texts, repeats=args.repeats, progress=_progress
    )
    print(format_encode_table(results), file=human)
    dtype, why = auto_choice(args.model)
    print(f"--dtype auto picks {dtype} here: {why}", file=human)
    return {"environment": env, "encode": as_json(results), "auto": {"dtype": dtype, "why": why}}


def _cpu_line(env: dict[str, object]) -> str:
    """The CPU's capability, what ``--dtype auto`` picks on it and why, and what ``--dtype
    int8`` gets (the form of its products, or why it is refused), on one line."""
    return (
        f"cpu: {env['cpu_capability']}, bf16 matmul {env['bf16_matmul']}; --dtype auto: "
        f"{env['auto_dtype']} ({env['auto_dtype_reason']}); --dtype int8: {env['int8']}"
    )


def _dispatch(args: argparse.Namespace, human: TextIO) -> dict[str, object]:
    import dataclasses

    from ..attention import policy
    from ..bench import environment

    caches = _timing_caches(forget=args.remeasure, human=human)
    _progress("measuring the machine (the dtype probe and the product libraries, once)")
    env = environment()
    print(_environment_line(env), file=human)
    print(_cpu_line(env), file=human)
    for what, path in caches.items():
        print(f"{what} kept in: {path}", file=human)
    print(
        "forget and time them again: bertattn bench --dispatch --remeasure "
        "(a timing taken while the CPU is busy is not kept)",
        file=human,
    )
    print("in use (src/bertattn/attention/policy.py):", file=human)
    print(policy.format_table(), file=human)
    out: dict[str, object] = {
        "environment": env,
        "caches": {what: str(path) for what, path in caches.items()},
        "table": [dataclasses.asdict(r) for r in policy.TABLE],
    }
    if args.measure:
        from ..bench.dispatch import derive_table, format_measurement, measure

        _progress("measuring the attention kernels (about a minute)")
        m = measure(quick=True, repeats=max(3, min(args.repeats, 5)))
        print(file=human)
        print(format_measurement(m), file=human)
        table = derive_table(m)
        print(file=human)
        print(
            "measured here (quick; not installed: python -m benchmarks.dispatch regenerates):",
            file=human,
        )
        print(policy.format_table(table), file=human)
        out["measured"] = {
            "kernels": m.kernels,
            "varlen": m.varlen,
            "table": [dataclasses.asdict(r) for r in table],
        }
    return out


def _timing_caches(*, forget: bool, human: TextIO) -> dict[str, Path]:
    """The files this machine's timed choices are kept in, by what they choose; with
    ``forget``, removed first (and this process's answers with them), so that
    :func:`bertattn.bench.environment` times them again."""
    from ..attention import gemm
    from ..encoder import auto_dtype
    from ..runtime import probe

    caches = {
        "dtype probe (--dtype auto)": probe.cache_path(),
        "product libraries": gemm.cache_path(),
    }
    if forget:
        for path in caches.values():
            gone = probe.forget(path)
            print(f"{'forgot' if gone else 'nothing kept in'} {path}", file=human)
        auto_dtype.reset()
        gemm.reset()
    return caches


def _write_json(data: dict[str, object], out: Path | None, *, to_stdout: bool) -> None:
    import json

    from ..files import write_atomic, write_stdout

    if out is None and not to_stdout:
        return
    text = json.dumps(data, indent=1) + "\n"
    if out is None:
        write_stdout(text.encode("utf-8"))
        return
    write_atomic(out, text.encode("utf-8"))
    print(f"{PROG}: wrote {out.resolve()}", file=sys.stderr)
