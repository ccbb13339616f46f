"""`bertattn encode`'s progress goes by tokens, not texts: the longest texts go first, so a bar
counting texts promised an end far too early (its first ETA said 7 minutes for a 64 s run).
The bar's total is the texts' real tokens, each batch adds its own, and it ends at the total."""

from __future__ import annotations

import pytest

from bertattn.jobs.encode import run_encode
from bertattn.jobs.encode_options import EncodeOptions


@pytest.mark.filterwarnings("ignore:1 of 5 inputs were longer")
def test_the_progress_bar_counts_tokens(tiny_checkpoint, tmp_path):
    texts = ["the attention head looks at every token " * k for k in (1, 9, 3, 20, 2)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    calls: list = []

    def progress(total: int, unit: str = "text"):  # type: ignore[no-untyped-def]
        calls.append(("bar", total, unit))
        return lambda n: calls.append(("update", n))

    options = EncodeOptions(
        input=src, output=tmp_path / "out.npy", model=str(tiny_checkpoint), batch_size=2,
        threads=1, quiet=True,
    )  # fmt: skip
    run_encode(options, progress=progress)
    bars = [c for c in calls if c[0] == "bar"]
    updates = [c[1] for c in calls if c[0] == "update"]
    from bertattn import Bert

    tokens = sum(len(e.ids) for e in Bert.load(tiny_checkpoint).tokenizer.encode_batch(texts))
    assert bars == [("bar", tokens, "token")]
    # batches of 2 texts, the short ones filled further (Bert.encode fills short batches):
    # the 20x and the 9x text, then the 3x, 2x and 1x ones in one forward
    assert sum(updates) == tokens and len(updates) == 2
    assert updates[0] > updates[-1]  # the longest first: a text count would misjudge the rate
