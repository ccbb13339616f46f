"""``bertattn attend`` on a multi-vector (ColBERT-style) model: which document token each query
token matched, beside the attention.

The query is attend's TEXT, the document its ``--pair DOC``. Their token rows are the model's
own (:meth:`~bertattn.MultiVectorEncoder.encode_query` /
:meth:`~bertattn.MultiVectorEncoder.encode_document`: prompts, per-task lengths, skip-list,
projection and normalization as the model scores them); the view holds the ``(query tokens x
document tokens)`` similarity matrix, each scored query token's best document token (the MaxSim
argmax) and its score, and the total, equal to :meth:`~bertattn.MultiVectorEncoder.similarity`
of the pair. The attention shown beside it is the model's encoder on the query (with its
prompt) and the document (with its prompt) as one pair: one forward over both, where MaxSim
encodes each alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError

if TYPE_CHECKING:
    from ..heads.multi_vector import MultiVectorEncoder
    from ..maps import AttentionMaps

__all__ = ["MaxSimView", "attention_texts", "compute_maxsim", "need_pair", "render_outputs"]

#: what the summary and the docs say of the attention shown beside the matches
ATTENTION_INPUT = (
    "the attention is the encoder's on the query (with its prompt) and the document (with its "
    "prompt) as one pair, one forward; the matches come from encoding each alone, as the model "
    "scores them"
)


@dataclass
class MaxSimView:
    """One query against one document, as the multi-vector model scores it.

    ``query_tokens`` / ``document_tokens``: every token each text was encoded as (prompt and
    specials included, cut at the model's query / document length); ``query_skipped`` /
    ``document_skipped``: the indices of those the skip-list drops (no row, never matched);
    ``matrix``: ``(len(query_tokens), len(document_tokens))`` float32 dot products of the rows,
    NaN in a skipped token's row or column; ``matches``: per scored query token, in order,
    ``(query_index, document_index, score)``; ``total``: the model's similarity of the pair
    (MaxSim, or mean-MaxSim by ``similarity_fn_name``)."""

    query_tokens: list[str]
    document_tokens: list[str]
    query_skipped: list[int]
    document_skipped: list[int]
    matrix: np.ndarray
    matches: list[tuple[int, int, float]]
    total: float
    similarity_fn_name: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data: the ``maxsim`` object of ``--json`` and of the page."""
        rows = [[None if np.isnan(x) else round(float(x), 6) for x in row] for row in self.matrix]
        return {
            "query_tokens": self.query_tokens,
            "document_tokens": self.document_tokens,
            "query_skipped": self.query_skipped,
            "document_skipped": self.document_skipped,
            "matches": [
                {"query_index": q, "document_index": d, "score": round(s, 6)}
                for q, d, s in self.matches
            ],
            "total": round(self.total, 6),
            "sum": round(sum(s for _, _, s in self.matches), 6),
            "similarity_fn_name": self.similarity_fn_name,
            "matrix": rows,
            "attention_input": ATTENTION_INPUT,
        }

    def summary(self) -> str:
        """The lines the command prints: the score, then each query token -> its match."""
        name = "mean-MaxSim" if self.similarity_fn_name == "meanmaxsim" else "MaxSim"
        lines = [
            f"{name} {self.total:.4f} of the query (TEXT) against the document (--pair); each "
            f"query token -> its best document token (score), from the model's encode_query / "
            f"encode_document rows:"
        ]
        best = {q: (d, s) for q, d, s in self.matches}
        for i, tok in enumerate(self.query_tokens):
            if i in best:
                d, s = best[i]
                lines.append(f"  {i:>4} {tok:<16} -> {d:>4} {self.document_tokens[d]} ({s:.4f})")
            else:
                lines.append(f"  {i:>4} {tok:<16}    skipped (skip-list: no row, not matched)")
        if self.document_skipped:
            shown = ", ".join(f"{j} {self.document_tokens[j]}" for j in self.document_skipped)
            lines.append(f"  document tokens skipped (skip-list): {shown}")
        lines.append(f"  ({ATTENTION_INPUT})")
        return "\n".join(lines)


def need_pair() -> UsageError:
    """The refusal of a multi-vector model without ``--pair``."""
    return UsageError(
        "--model is a multi-vector (MaxSim) model, which scores a query against a document: got "
        "one text and no --pair; give the query as TEXT and the document as --pair DOC, e.g. "
        "bertattn attend 'what is the capital of France?' --pair 'Paris is the capital of "
        "France.' --model FOLDER."
    )


def attention_texts(model: MultiVectorEncoder, query: str, document: str) -> tuple[str, str]:
    """The pair whose attention is shown: each text with the prompt its task gets from
    ``encode_query`` / ``encode_document``."""

    def prompt(task: str) -> str:  # the task's own prompt, else the folder's default one
        if task in model.prompts:
            return model.prompts[task] or ""
        name = model.default_prompt_name
        return (model.prompts.get(name) if name else None) or ""

    return prompt("query") + query, prompt("document") + document


def compute_maxsim(model: MultiVectorEncoder, query: str, document: str) -> MaxSimView:
    """The :class:`MaxSimView` of ``query`` against ``document`` from ``model``'s own rows.

    Raises ``ValueError`` when the model scores no token of the query or of the document
    (a text of skip-list tokens only)."""
    import torch

    q_tokens, q_scored = model.scored_tokens(query, "query")
    d_tokens, d_scored = model.scored_tokens(document, "document")
    q_skip = [i for i, k in enumerate(q_scored) if not k]
    d_skip = [j for j, k in enumerate(d_scored) if not k]
    q_rows = model.encode_query(query)  # (scored query tokens, dim)
    d_rows = model.encode_document(document)
    q_kept = [i for i in range(len(q_tokens)) if i not in set(q_skip)]
    d_kept = [j for j in range(len(d_tokens)) if j not in set(d_skip)]
    if len(q_kept) != len(q_rows) or len(d_kept) != len(d_rows):  # an internal inconsistency
        raise RuntimeError(
            f"the model gave {len(q_rows)} query and {len(d_rows)} document rows for "
            f"{len(q_kept)} and {len(d_kept)} scored tokens."
        )
    for what, rows in (("the query (TEXT)", q_rows), ("the document (--pair)", d_rows)):
        if len(rows) == 0:
            raise ValueError(
                f"{what} has no token the model scores: every token is on its skip-list; "
                f"give a text with words in it."
            )
    with torch.inference_mode():
        sim = (q_rows.float() @ d_rows.float().T).cpu().numpy()  # (kept q, kept d)
        total = float(model.similarity([q_rows], [d_rows])[0, 0])
    matrix = np.full((len(q_tokens), len(d_tokens)), np.nan, dtype=np.float32)
    matrix[np.ix_(q_kept, d_kept)] = sim
    best = sim.argmax(axis=1)
    matches = [(q_kept[r], d_kept[int(c)], float(sim[r, c])) for r, c in enumerate(best)]
    return MaxSimView(
        q_tokens, d_tokens, q_skip, d_skip, matrix, matches, total, model.similarity_fn_name
    )


def render_outputs(
    maps: AttentionMaps,
    view: MaxSimView,
    *,
    png: str | os.PathLike[str] | None,
    html: str | os.PathLike[str] | None,
    json_path: str | os.PathLike[str] | None,
    layer: int | None,
    head: int | None,
    rollout: bool,
    stdout: str | None = None,
) -> tuple[list[Path], bytes | None]:
    """:func:`bertattn.viz.render_all` with the MaxSim view: the page gets its MaxSim view and
    the JSON its ``maxsim`` object (the PNG's title already names the score, through
    ``maps.model_name``). Files are written all together or not at all; ``stdout``
    (``"HTML"`` or ``"JSON"``): that output's bytes are returned instead of written."""
    from .. import viz
    from ..files import write_all

    png_layer, png_head = layer or 0, head or 0
    viz.check_layer_head(maps, png_layer, png_head)
    roll = viz.attention_rollout(maps) if rollout else None
    data = view.to_dict()

    def page() -> bytes:
        return viz.render_html(maps, rollout=roll, layer=layer, head=head, maxsim=data).encode(
            "utf-8"
        )

    def as_json() -> bytes:
        out = maps.to_dict()
        if roll is not None:
            out["rollout"] = [[round(float(x), 6) for x in row] for row in roll]
        out["maxsim"] = data
        return json.dumps(out, allow_nan=False).encode("utf-8")

    items: list[tuple[str | os.PathLike[str], bytes]] = []
    if png is not None:
        items.append((png, viz.render_png(maps, layer=png_layer, head=png_head, rollout=roll)))
    if html is not None:
        items.append((html, page()))
    if json_path is not None:
        items.append((json_path, as_json()))
    out = None if stdout is None else (page() if stdout == "HTML" else as_json())
    return (write_all(items) if items else []), out
