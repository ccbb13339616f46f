"""Regenerate the attention dispatch policy table (src/bertattn/attention/policy.py).

    python -m benchmarks.dispatch [--quick] [--repeats 5] [--no-varlen] [--json FILE] [--write]

Measures, per size class, ``math`` (matmul + softmax, no weights) against fused ``sdpa`` and
the padding share from which packing (``varlen``) pays (bertattn.bench.dispatch), prints the
numbers, the derived table and its Python source. ``--write`` replaces the generated block of
policy.py with it (review the diff: a shared, noisy machine can mislead). CUDA rows and the
rows of other dtypes are kept as they are (bf16 cannot be measured natively on a CPU without
AVX512_BF16 / AMX: the environment line says which this is).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import torch

from bertattn.attention import policy
from bertattn.bench.dispatch import derive_table, format_measurement, measure

POLICY_PY = Path(policy.__file__)
_BLOCK = re.compile(
    r"(# BEGIN GENERATED TABLE[^\n]*\n).*?(\n# END GENERATED TABLE)", flags=re.DOTALL
)


def write_table(table: tuple[policy.Rule, ...], path: Path = POLICY_PY) -> None:
    """Replace the generated block of policy.py with ``table``'s source."""
    text = path.read_text(encoding="utf-8")
    if not _BLOCK.search(text):
        raise SystemExit(f"{path}: no '# BEGIN GENERATED TABLE' ... '# END' block")
    path.write_text(
        _BLOCK.sub(lambda m: m.group(1) + policy.table_source(table) + m.group(2), text),
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one shape per class, fewer paddings")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--no-varlen", action="store_true", help="kernels only (no packing runs)")
    ap.add_argument("--json", help="also write the measurement and the table to this file")
    ap.add_argument("--write", action="store_true", help="write the table into policy.py")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    m = measure(quick=args.quick, repeats=args.repeats, varlen=not args.no_varlen)
    print(format_measurement(m))
    table = derive_table(m)
    print()
    print(policy.format_table(table))
    print()
    print(policy.table_source(table))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "environment": m.environment,
                    "kernels": m.kernels,
                    "varlen": m.varlen,
                    "table": [dataclasses.asdict(r) for r in table],
                },
                f,
                indent=1,
            )
        print(f"wrote {args.json}")
    if args.write:
        write_table(table)
        print(f"wrote {POLICY_PY}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
