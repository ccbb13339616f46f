"""The thread governor's quiet cost, A/B in one process: ``Bert.encode`` with its governor against
the same model without one, on short texts, beside other peers that share the process.

``python -m benchmarks.governor_ab [--peers transformers,openvino,bf16] [--rounds 6] [--no-looks]``

``benchmarks.shared`` runs six peers in each child; there the governed fp32 peer measured ~0.8x
the ungoverned one on a quiet machine. This isolates which neighbour does it: with no peer the
two are level; name peers to add them (``transformers``: sdpa fp32, ``openvino``: f32, ``bf16``:
bertattn bf16). ``--no-looks``: the governor never looks for contention (so never probes),
which separates the probes' cost from the per-batch bookkeeping. Prints texts/s per round
(peers interleaved, later rounds shuffled), the medians, on / off, and what the governor did.
Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

from bertattn import Bert
from bertattn.bench import environment, interleaved_medians
from bertattn.encoder.pipeline import default_model_dir

from .corpus import stdlib_docstring_corpus

PEERS = ("transformers", "openvino", "bf16")


def _peers(names: list[str], tokenizer) -> dict[str, Callable[[list[str]], object]]:  # type: ignore[no-untyped-def]
    folder = str(default_model_dir())
    out: dict[str, Callable[[list[str]], object]] = {}
    if "transformers" in names:
        from .encode import _hf_encoder

        out["transformers sdpa fp32"] = _hf_encoder(folder, autocast=False)
    if "openvino" in names:
        from .openvino_peer import openvino_encoders

        ov, _, missing = openvino_encoders(folder, tokenizer, precisions=("f32",))
        if missing:
            print(f"openvino peer missing: {missing}")
        out.update(ov)
    if "bf16" in names:
        import torch

        bf16 = Bert.load(dtype=torch.bfloat16)
        bf16.max_length = 256
        out["bertattn bf16"] = bf16.encode
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.governor_ab", description=__doc__)
    parser.add_argument("--peers", default="", help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument("--texts", type=int, default=300, help="short texts (default 300)")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (default 6)")
    parser.add_argument("--no-looks", action="store_true", help="the governor never probes")
    args = parser.parse_args(argv)
    names = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}; expected some of {', '.join(PEERS)}")
    texts = stdlib_docstring_corpus(args.texts)
    on, off = Bert.load(), Bert.load()
    off.governor = None
    for bert in (on, off):
        bert.max_length = 256
    gov = on.governor
    if gov is None:
        parser.error(
            "the governor is off (BERTATTN_ADAPTIVE_THREADS=0, --threads or OMP_NUM_THREADS)"
        )
    if args.no_looks:
        gov.min_look_s = gov.max_look_s = gov._look_s = float("inf")
    fns: dict[str, Callable[[list[str]], object]] = {
        "governor on": on.encode,
        "governor off": off.encode,
    }
    fns.update(_peers(names, on.tokenizer))
    env = environment()
    print(f"cpu: {env['processor']}, {env['cpu_capability']}; peers: {', '.join(fns)}")
    timer = interleaved_medians(
        {name: (lambda fn=fn: fn(texts)) for name, fn in fns.items()}, repeats=args.rounds
    )
    rates = {name: [len(texts) / t for t in samples] for name, samples in timer.samples.items()}
    for name, values in rates.items():
        print(f"{name}: " + " ".join(f"{v:.0f}" for v in values) + " texts/s by round")
    med = {name: statistics.median(v) for name, v in rates.items()}
    print("medians, texts/s: " + ", ".join(f"{n} {v:.0f}" for n, v in med.items()))
    print(f"governor on / off: {med['governor on'] / med['governor off']:.2f}; {gov.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
