"""Peak resident memory of one attention forward, each peer in a fresh subprocess.

``python -m bertattn.bench.memory PEER SEQ_LEN`` runs one forward (B=1, E=768, H=12, fp32,
eval, no grad) and prints the process's peak RSS in MiB; :func:`peak_memory` runs it for each
peer and subtracts nothing (the baseline — interpreter, torch, weights — is the same for all and
is reported as ``baseline`` from a run that builds the module and input but skips the forward).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

PEERS = ("baseline", "bertattn", "article")


def _child(peer: str, seq_len: int) -> None:
    import torch

    from ..attention import MultiHeadAttention
    from .article import ArticleMultiHeadAttention

    torch.manual_seed(0)
    cls = ArticleMultiHeadAttention if peer == "article" else MultiHeadAttention
    module = cls(768, 12, 0.0).eval()
    x = torch.randn(1, seq_len, 768)
    with torch.inference_mode():
        if peer == "bertattn":
            module(x, need_weights=False)
        elif peer == "article":
            module(x)
    print(json.dumps({"peer": peer, "peak_mib": peak_rss_mib()}))


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB). ``VmHWM`` belongs to the address space made by
    exec, whereas Linux's ``ru_maxrss`` keeps the parent's peak across fork + exec."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: best effort


def peak_memory(seq_len: int = 8192) -> dict[str, float]:
    """Peak RSS (MiB) per peer, each measured in its own fresh interpreter."""
    out: dict[str, float] = {}
    for peer in PEERS:
        proc = subprocess.run(
            [sys.executable, "-m", "bertattn.bench.memory", peer, str(seq_len)],
            capture_output=True,
            text=True,
            check=True,
        )
        out[peer] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mib"]
    return out


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
