"""sentence-transformers 6's ``CrossEncoder``, ``SparseEncoder`` and ``MultiVectorEncoder``
methods that bertattn's head classes lack (``fit``, ``to``, ``half``, ``push_to_hub``,
``start_multi_process_pool``, ...): each raises an ``AttributeError`` whose one line names
bertattn's equivalent or what to use instead; every public name of the upstream class that
bertattn's has not is in the one table (heads/missing.py)."""

from __future__ import annotations

import pytest
from test_heads_cross_encoder import save_classifier
from test_multi_vector import build

from bertattn import CrossEncoder, MultiVectorEncoder, SparseEncoder
from bertattn.heads.missing import MISSING


@pytest.fixture(scope="module")
def models(tiny_checkpoint, splade_dir, tmp_path_factory) -> dict[str, object]:
    reranker = save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("miss_rr"), 1, seed=7)
    mv = build(tiny_checkpoint, tmp_path_factory.mktemp("miss_mv") / "mv", width=16)
    return {
        "CrossEncoder": CrossEncoder(reranker),
        "SparseEncoder": SparseEncoder(splade_dir),
        "MultiVectorEncoder": MultiVectorEncoder(mv),
    }


def _upstream_only(name: str, ours: object) -> list[str]:
    import sentence_transformers

    theirs = getattr(sentence_transformers, name)
    return sorted(n for n in dir(theirs) if not n.startswith("_") and not hasattr(ours, n))


@pytest.mark.parametrize("name", ["CrossEncoder", "SparseEncoder", "MultiVectorEncoder"])
def test_every_upstream_name_it_lacks_is_in_the_table(models, name):
    lacking = _upstream_only(name, models[name])
    assert {"to", "half", "push_to_hub", "start_multi_process_pool"} <= set(lacking)
    assert [n for n in lacking if n not in MISSING] == []


@pytest.mark.parametrize(
    ("name", "call", "message"),
    [
        ("CrossEncoder", lambda m: m.fit([]), r"CrossEncoder has no 'fit' .*: bertattn runs "
         r"inference only: train with sentence-transformers"),
        ("CrossEncoder", lambda m: m.to("cuda"), r"CrossEncoder has no 'to' .*device when "
         r"loading \(CrossEncoder\(folder, device='cuda'\)\) or per call"),
        ("SparseEncoder", lambda m: m.half(), r"SparseEncoder has no 'half' .*: choose the "
         r"compute dtype when loading: SparseEncoder\(folder, dtype=torch.float16\)\.$"),
        ("SparseEncoder", lambda m: m.push_to_hub("org/name"), r"no 'push_to_hub' .*save\("
         r"folder\), then upload it with huggingface_hub"),
        ("MultiVectorEncoder", lambda m: m.start_multi_process_pool(), r"MultiVectorEncoder has "
         r"no 'start_multi_process_pool' .*encodes in this process, on one device"),
        ("MultiVectorEncoder", lambda m: m.parameters(), r"not a torch module; its encoder is "
         r"\.model \(a torch.nn.Module: model.model.parameters\(\.\.\.\)\)"),
        ("MultiVectorEncoder", lambda m: m.tokenize(["a"]), r"no 'tokenize' .*: tokenize with "
         r"\.tokenizer"),
    ],
)  # fmt: skip
def test_a_missing_method_says_what_to_use(models, name, call, message):
    with pytest.raises(AttributeError, match=message) as info:
        call(models[name])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["CrossEncoder", "SparseEncoder", "MultiVectorEncoder"])
def test_other_names_keep_pythons_error_and_hasattr_stays_false(models, name):
    model = models[name]
    with pytest.raises(AttributeError, match=rf"^'{name}' object has no attribute 'nope'$"):
        model.nope  # noqa: B018
    assert not hasattr(model, "fit") and not hasattr(model, "to")
    assert isinstance(model.tokenizer, object) and model.device is not None  # real ones intact


def test_the_table_points_at_what_exists(models):
    """The equivalents the table names are there: .model, .tokenizer, .device, save()."""
    for model in models.values():
        assert callable(model.model.parameters) and callable(model.tokenizer)
        assert callable(model.save) and model.device.type == "cpu"
    assert models["SparseEncoder"].chunk_tokens >= 1  # splade_pooling_chunk_size's equivalent
