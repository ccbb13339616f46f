"""``bertattn.pipeline`` takes the pipeline's own options at construction, as transformers
does (``pipeline("token-classification", model=..., aggregation_strategy="simple")``): they
are every call's defaults, a call's own options win, and an unknown keyword is named against
the pipeline (with the options it takes), never against ``Bert.load``. Against transformers'
pipelines built the same way on the same folders."""

from __future__ import annotations

import pytest
from test_heads_pipelines import same, sentiment, tagger  # noqa: F401  (fixtures)

import bertattn

TEXTS = ["the attention head looks at every token", "hello world bert model layer"]


def test_token_classification_options_at_construction(tagger):  # noqa: F811
    import transformers

    ours = bertattn.pipeline("token-classification", model=tagger, aggregation_strategy="simple")
    theirs = transformers.pipeline(
        "token-classification", model=str(tagger), aggregation_strategy="simple"
    )
    same(ours(TEXTS), theirs(TEXTS))
    assert sum(map(len, ours(TEXTS))) > 0
    assert all("entity_group" in e for row in ours(TEXTS) for e in row)
    # a call's own option wins over the construction's
    same(ours(TEXTS, aggregation_strategy="none"), theirs(TEXTS, aggregation_strategy="none"))
    assert all("entity" in e for row in ours(TEXTS, aggregation_strategy="none") for e in row)


def test_text_classification_and_fill_mask_options_at_construction(sentiment, splade_dir):  # noqa: F811
    import transformers

    ours = bertattn.pipeline("text-classification", sentiment, top_k=None, threads=1)
    theirs = transformers.pipeline("text-classification", model=str(sentiment), top_k=None)
    same(ours(TEXTS), theirs(TEXTS))
    assert len(ours(TEXTS)[0]) == 3  # every label
    fill = bertattn.pipeline("fill-mask", splade_dir, top_k=2)
    assert len(fill("the cat sat on the [MASK].")) == 2
    assert len(fill("the cat sat on the [MASK].", top_k=4)) == 4


@pytest.mark.parametrize(
    ("task", "kwargs", "message"),
    [
        (
            "token-classification",
            {"aggregation_stratgy": "simple"},
            r"pipeline\('token-classification'\) got an unexpected keyword argument "
            r"'aggregation_stratgy'; the token-classification pipeline takes "
            r"aggregation_strategy, ignore_labels, batch_size, stride, and loading takes device",
        ),
        (
            "text-classification",
            {"aggregation_strategy": "simple"},
            r"got an unexpected keyword argument 'aggregation_strategy'; the "
            r"text-classification pipeline takes top_k, function_to_apply, batch_size",
        ),
    ],
)
def test_an_unknown_keyword_is_named_against_the_pipeline(task, kwargs, message, tagger):  # noqa: F811
    with pytest.raises(TypeError, match=message) as info:
        bertattn.pipeline(task, tagger, **kwargs)
    assert "Bert.load" not in str(info.value)


def test_an_unknown_call_option_is_named_against_the_pipeline(tagger):  # noqa: F811
    pipe = bertattn.pipeline("token-classification", tagger, threads=1)
    with pytest.raises(TypeError, match=r"the token-classification pipeline got an unexpected "
                       r"keyword argument 'top_k' \(in the call\(...\)\); its options are "
                       r"aggregation_strategy"):  # fmt: skip
        pipe(TEXTS, top_k=3)
    with pytest.raises(ValueError, match="aggregation_strategy must be one of"):
        bertattn.pipeline("token-classification", tagger, aggregation_strategy="bogus")(TEXTS)
