"""The rest of ``SentenceTransformer``'s surface on :class:`bertattn.Bert`, and the one table of
where it deliberately differs.

:class:`SentenceTransformerSurface` is a base class of ``Bert``: :meth:`encode_query` /
:meth:`encode_document` (``encode``'s parameters, with the query / document prompt and
``task``), :meth:`truncate_embeddings`, :meth:`get_max_seq_length`, :attr:`dtype`, and the
``output_value=None`` rows, batched and padded as sentence-transformers batches and pads them.

:data:`DIFFERENCES` lists every deliberate difference from sentence-transformers' methods of
the same names; ``tests/test_bert_st_surface.py`` compares the signatures against it, and the
docs/python-api.md shows it (:func:`differences_markdown`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import ModelFolderError
from .encode_call import ST_ENCODE, arguments, takes
from .st_compat import input_aliases

if TYPE_CHECKING:
    from .folder import ModelFolder
    from .model import BertModel
    from .tokenizer import BertTokenizer

__all__ = ["DIFFERENCES", "Difference", "SentenceTransformerSurface", "differences_markdown"]


@dataclass(frozen=True)
class Difference:
    """One deliberate difference from ``SentenceTransformer``'s method ``method``.

    ``kind``: ``"added"`` (a parameter only ``Bert`` has), or ``"behaviour"`` (the same
    parameter, or input, handled differently); ``what`` the parameter or input; ``why`` the
    reason and what to do instead."""

    method: str
    kind: str
    what: str
    why: str


#: every deliberate difference between ``Bert``'s and ``SentenceTransformer``'s methods of the
#: same name (signatures are checked against it by the tests; shown in docs/python-api.md)
DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "encode", "added", "pooling", "bertattn's keyword: mean / cls / max (default: the folder's)"
    ),
    Difference(
        "encode", "added", "normalize", "bertattn's keyword: override the folder's Normalize module"
    ),
    Difference(
        "encode", "added", "max_length", "bertattn's keyword: tokens kept (default: max_seq_length)"
    ),
    Difference(
        "encode", "added", "progress", "bertattn's keyword: called with each batch's text count"
    ),
    Difference(
        "encode", "added", "batch_tokens", "bertattn's keyword: cap a batch's padded tokens"
    ),
    Difference(
        "encode",
        "behaviour",
        "batch_size",
        "on the CPU a batch of short texts takes more than batch_size of them, up to the tokens "
        "that keep every core busy and never more than batch_size texts of max_length tokens: "
        "fewer, faster forwards (the progress bar counts those)",
    ),
    Difference(
        "encode",
        "behaviour",
        "pool, device=[...]",
        "multi-process encoding is refused (UnsupportedArgumentError): use `bertattn encode "
        "--workers N`",
    ),
    Difference(
        "encode",
        "behaviour",
        "processing_kwargs",
        'only {"text": {"max_length": N}} is honoured (padding / truncation at their defaults '
        "accepted); anything else is refused",
    ),
    Difference(
        "encode",
        "behaviour",
        "inputs",
        "text and text pairs only; images, audio, messages and lists mixing texts with pairs are "
        "refused",
    ),
    Difference(
        "encode",
        "behaviour",
        "output_value=None",
        "token_embeddings at padding positions are the backend's (zeros under varlen), not the "
        "model's output there; pooling never reads them",
    ),
    Difference(
        "encode",
        "behaviour",
        "inputs=[]",
        "an empty list gives a (0, E) float32 array, not sentence-transformers' (0,) float64 one",
    ),
)


def differences_markdown() -> str:
    """:data:`DIFFERENCES` as the markdown table of docs/python-api.md."""
    lines = ["| method | kind | what | why |", "|---|---|---|---|"]
    for d in DIFFERENCES:
        lines.append(f"| `{d.method}` | {d.kind} | `{d.what}` | {d.why} |")
    return "\n".join(lines)


class SentenceTransformerSurface:
    """sentence-transformers' methods beyond ``encode``, for :class:`bertattn.Bert`."""

    model: BertModel
    tokenizer: BertTokenizer
    folder: ModelFolder | None
    prompts: dict[str, str]
    truncate_dim: int | None
    include_prompt: bool
    max_seq_length: int
    encode: Callable[..., Any]
    # Bert's encoding steps, which the output_value=None rows reuse
    _prompt_length: Callable[[str, int], int]
    _forward: Callable[..., tuple[Any, torch.Tensor, torch.Tensor]]
    _sentences: Callable[..., torch.Tensor]

    # ------------------------------------------------------------------ encode variants
    @input_aliases
    @takes(ST_ENCODE)
    def encode_query(self, *args: Any, **kwargs: Any) -> Any:
        """``encode`` with the ``"query"`` prompt unless ``prompt`` / ``prompt_name`` is given
        (``""`` unless the folder sets one, so ``default_prompt_name`` does not apply) and
        ``task="query"``, as sentence-transformers does; ``encode``'s parameters and
        bertattn's keywords otherwise."""
        given = arguments(ST_ENCODE, self, args, kwargs)
        if given["prompt_name"] is None and given["prompt"] is None and "query" in self.prompts:
            given["prompt_name"] = "query"
        return self._encode_task("query", given)

    @input_aliases
    @takes(ST_ENCODE)
    def encode_document(self, *args: Any, **kwargs: Any) -> Any:
        """``encode`` with the first of the ``"document"`` / ``"passage"`` / ``"corpus"``
        prompts unless ``prompt`` / ``prompt_name`` is given, and ``task="document"``, as
        sentence-transformers does."""
        given = arguments(ST_ENCODE, self, args, kwargs)
        if given["prompt_name"] is None and given["prompt"] is None:
            given["prompt_name"] = next(
                (n for n in ("document", "passage", "corpus") if n in self.prompts), None
            )
        return self._encode_task("document", given)

    def _encode_task(self, task: str, given: dict[str, Any]) -> Any:
        kwargs = given.pop("kwargs")
        if "task" in kwargs:
            raise TypeError(
                f"encode_{task}() sets task={task!r} itself and got task={kwargs['task']!r} "
                f"too (sentence-transformers raises here as well); call encode(..., "
                f"task=...) for another task."
            )
        return self.encode(**given, task=task, **kwargs)

    # ------------------------------------------------------------------ settings
    @contextmanager
    def truncate_embeddings(self, truncate_dim: int | None) -> Iterator[None]:
        """Within this block, ``encode`` keeps the first ``truncate_dim`` dimensions of each
        sentence embedding (None: all of them); :attr:`truncate_dim` is restored on exit."""
        if truncate_dim is not None and (
            isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim < 1
        ):
            raise ValueError(
                f"truncate_dim must be a positive int or None, got {truncate_dim!r}; e.g. "
                f"truncate_embeddings(64)."
            )
        before = self.truncate_dim
        self.truncate_dim = truncate_dim
        try:
            yield
        finally:
            self.truncate_dim = before

    def get_max_seq_length(self) -> int:
        """:attr:`max_seq_length` (sentence-transformers' older accessor)."""
        return self.max_seq_length

    @property
    def dtype(self) -> torch.dtype:
        """The model's compute dtype (``torch.float32`` unless loaded with another)."""
        return self.model.dtype

    def _check_pairs(self) -> None:
        """Refuse text pairs on a model with one token type (the second text's type would
        have no row in the token-type embedding), naming the config and the fix."""
        top = self.tokenizer.max_type_id(pair=True)
        types = self.model.config.type_vocab_size
        if top < types:
            return
        config = "config.json" if self.folder is None else self.folder.config_path
        raise ModelFolderError(
            f"{config}: type_vocab_size={types}, but the tokenizer gives the second text of a "
            f"pair token type {top}: this model takes no text pairs. Encode the texts one by "
            f"one, or use a model with type_vocab_size >= {top + 1}."
        )

    # ------------------------------------------------------------------ output_value=None
    def _st_rows(
        self,
        texts: list[str],
        pairs: list[str] | None,
        *,
        prompt: str | None,
        batch_size: int,
        limit: int,
        pooling: str,
        normalize: bool,
        truncate_dim: int | None,
        show_progress_bar: bool,
        progress: Callable[[int], object] | None,
    ) -> list[dict[str, Any]]:
        """``output_value=None``: one dict per input, in input order, each row padded to its
        batch as sentence-transformers gives them: the inputs sorted longest first by
        character count (pairs: both texts), cut into ``batch_size`` batches, each padded to
        its longest tokenized input."""
        sizes = [len(t) + (len(pairs[i]) if pairs else 0) for i, t in enumerate(texts)]
        order = np.argsort([-s for s in sizes])  # sentence-transformers' own sort, ties and all
        prompt_length = self._prompt_length(prompt, limit) if prompt else 0
        skip = 0 if self.include_prompt else prompt_length
        firsts = [prompt + t for t in texts] if prompt else texts
        encodings = self.tokenizer.encode_batch(firsts, pairs, max_length=limit)
        device = self.model.device
        rows: list[dict[str, Any]] = [{} for _ in texts]
        from tqdm import tqdm

        starts = range(0, len(texts), batch_size)
        with torch.inference_mode():
            for start in tqdm(starts, desc="Batches", disable=not show_progress_bar):
                idx = [int(i) for i in order[start : start + batch_size]]
                batch, mask, hidden = self._forward([encodings[i] for i in idx])
                emb = self._sentences(hidden, mask, pooling, normalize, skip)
                if truncate_dim is not None:
                    emb = emb[:, :truncate_dim]
                for j, i in enumerate(idx):
                    row: dict[str, Any] = {
                        "input_ids": batch.input_ids[j].to(device),
                        "token_type_ids": batch.token_type_ids[j].to(device),
                        "attention_mask": mask[j],
                        "modality": "text",
                    }
                    if prompt:
                        row["prompt_length"] = prompt_length
                    row["token_embeddings"] = hidden[j]
                    row["sentence_embedding"] = emb[j]
                    rows[i] = row
                if progress is not None:
                    progress(len(idx))
        return rows
