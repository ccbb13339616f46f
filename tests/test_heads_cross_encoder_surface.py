"""``CrossEncoder``'s sentence-transformers surface, against sentence-transformers' own
``CrossEncoder`` on the same folder: NumPy input (a 1-D array is one pair, 2-D a batch, empty
an empty answer), prompts (``prompt_name`` / ``prompt``, a folder's ``default_prompt_name``
applied), ``activation_fn`` a ``torch.nn`` module, ``rank()``'s deprecated keywords taken with
a warning, and sentence-transformers' reranking evaluator run on bertattn's model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_heads_cross_encoder import save_classifier

from bertattn import CrossEncoder

PAIRS = [
    ("the attention head", "looks at every token in the sentence"),
    ("hello", "the first text is short"),
    ("bert model layer", "hello"),
]


@pytest.fixture(scope="module")
def reranker(tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr"), 1, seed=3)


@pytest.fixture(scope="module")
def pair(reranker):  # type: ignore[no-untyped-def]
    from sentence_transformers import CrossEncoder as STCrossEncoder

    return CrossEncoder(reranker, threads=1), STCrossEncoder(str(reranker), device="cpu")


def test_numpy_arrays_of_pairs(pair):
    ours, theirs = pair
    batch = np.array(PAIRS)
    np.testing.assert_allclose(ours.predict(batch), theirs.predict(batch), atol=1e-5)
    np.testing.assert_allclose(ours.predict(batch), ours.predict(PAIRS), atol=1e-7)
    one = np.array(PAIRS[0])
    assert np.ndim(ours.predict(one)) == 0
    np.testing.assert_allclose(ours.predict(one), theirs.predict(one), atol=1e-5)
    for empty in (np.array([], dtype=str), np.array([], dtype=str).reshape(0, 2), []):
        got, want = ours.predict(empty), theirs.predict(empty)
        assert isinstance(got, np.ndarray) and got.shape == want.shape == (0,)
    assert ours.predict(np.array([])).shape == (0,)  # an empty float array: no pairs either
    assert ours.predict([], convert_to_tensor=True).shape == (0,)


def test_activation_fn_is_a_torch_module(pair, reranker, tmp_path):
    ours, theirs = pair
    assert isinstance(ours.activation_fn, torch.nn.Sigmoid)
    assert type(ours.activation_fn) is type(theirs.activation_fn)
    theirs_tanh = type(theirs)(str(reranker), device="cpu", activation_fn=torch.nn.Tanh())
    theirs_tanh.save(str(tmp_path / "tanh"))
    loaded = CrossEncoder(tmp_path / "tanh", threads=1)
    assert isinstance(loaded.activation_fn, torch.nn.Tanh)
    np.testing.assert_allclose(loaded.predict(PAIRS), theirs_tanh.predict(PAIRS), atol=1e-5)
    ident = CrossEncoder(reranker, threads=1, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(ident.predict(PAIRS), ours.logits(PAIRS)[:, 0].numpy(), atol=1e-6)


def test_prompts_and_the_folders_default_prompt(reranker, tmp_path, caplog):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    prompts = {"query": "query: ", "web": "Represent this web search: "}
    theirs = STCrossEncoder(
        str(reranker), device="cpu", prompts=prompts, default_prompt_name="query"
    )
    theirs.save(str(tmp_path / "st"))
    theirs = STCrossEncoder(str(tmp_path / "st"), device="cpu")
    ours = CrossEncoder(tmp_path / "st", threads=1)
    assert ours.prompts == theirs.prompts and ours.default_prompt_name == "query"
    plain = CrossEncoder(reranker, threads=1).predict(PAIRS)
    default = ours.predict(PAIRS)
    assert not np.allclose(default, plain, atol=1e-4)  # the folder's default prompt applied
    np.testing.assert_allclose(default, theirs.predict(PAIRS), atol=1e-5)
    for kwargs in ({"prompt_name": "web"}, {"prompt": "x: "}, {"prompt": ""}):
        np.testing.assert_allclose(
            ours.predict(PAIRS, **kwargs), theirs.predict(PAIRS, **kwargs), atol=1e-5
        )
    np.testing.assert_allclose(ours.predict(PAIRS, prompt=""), plain, atol=1e-6)
    with caplog.at_level("WARNING", logger="bertattn.heads"):  # prompt wins, as theirs
        both = ours.predict(PAIRS, prompt="x: ", prompt_name="web")
    np.testing.assert_allclose(both, theirs.predict(PAIRS, prompt="x: "), atol=1e-5)
    assert "Ignoring the `prompt_name` in favor of `prompt`." in caplog.text
    docs = [d for _, d in PAIRS]
    got = ours.rank("the attention head", docs, prompt_name="web")
    want = theirs.rank("the attention head", docs, prompt_name="web")
    assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in want]
    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], atol=1e-5)
    with pytest.raises(ValueError, match=r"prompt_name 'nope' is not among this model's prompts"):
        ours.predict(PAIRS, prompt_name="nope")
    with pytest.raises(ValueError, match=r"default_prompt_name 'nope' is not among the prompts"):
        CrossEncoder(reranker, default_prompt_name="nope")


def test_rank_takes_the_deprecated_keywords_with_a_warning(pair):
    ours, _ = pair
    docs = [d for _, d in PAIRS]
    want = ours.rank("the attention head", docs)
    for name in ("convert_to_numpy", "convert_to_tensor", "apply_softmax"):
        with pytest.warns(FutureWarning, match=f"rank's {name} argument is deprecated"):
            assert ours.rank("the attention head", docs, **{name: True}) == want
    with pytest.raises(TypeError, match="unexpected keyword argument 'nonsense'"):
        ours.rank("the attention head", docs, nonsense=1)


def test_sentence_transformers_reranking_evaluator_runs_on_it(pair):
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    ours, theirs = pair
    samples = [
        {"query": "the attention head", "positive": [PAIRS[0][1]], "negative": [PAIRS[1][1]]},
        {"query": "hello", "positive": [PAIRS[2][1]], "negative": [PAIRS[0][1], PAIRS[1][1]]},
    ]
    evaluator = CrossEncoderRerankingEvaluator(samples, name="tiny", show_progress_bar=False)
    got, want = evaluator(ours), evaluator(theirs)
    assert got.keys() == want.keys()
    assert got == pytest.approx(want, abs=1e-6)
    assert ours.model_card_data.runs[-1][:2] == ("tiny", got)


def test_settings_read_as_sentence_transformers_names_them(pair):
    ours, theirs = pair
    assert ours.max_seq_length == theirs.max_length == ours.get_max_seq_length()
    assert ours.dtype == torch.float32
    assert type(ours.get_default_activation_fn()) is type(theirs.get_default_activation_fn())
    before = ours.max_seq_length
    try:
        ours.max_seq_length = 16
        assert ours.max_length == 16
    finally:
        ours.max_seq_length = before


def test_default_activation_function_is_deprecated_as_in_sentence_transformers(pair):  # type: ignore[no-untyped-def]
    ours, theirs = pair
    with pytest.warns(DeprecationWarning, match="default_activation_function` property was"):
        fn = ours.default_activation_function
    assert type(fn) is type(ours.get_default_activation_fn()) is torch.nn.Sigmoid
    with pytest.warns(DeprecationWarning):
        assert type(theirs.default_activation_function) is torch.nn.Sigmoid
