"""What a job that writes one output did (:class:`EncodeSummary`): shared by ``encode``
(:mod:`.encode`) and the heads' jobs (:mod:`.heads`), which import it from here, not from
each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["EncodeSummary"]


@dataclass
class EncodeSummary:
    """What a job writing one output did (encode, rerank, predict), for the final report line
    (``str(summary)``)."""

    output: Path
    detail: str

    def __str__(self) -> str:
        return f"{self.output}: {self.detail}"
