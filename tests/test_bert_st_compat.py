"""``Bert.encode`` against ``SentenceTransformer.encode``, call by call, on the real
all-MiniLM-L6-v2 (and copies of it with other pooling / prompt / similarity settings): the same
parameters (order and defaults), the same outputs and return types; and the calls bertattn
refuses, with messages that say what and why."""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import warnings

import numpy as np
import pytest
import torch

from bertattn import Bert
from bertattn.encoder.pipeline import (
    PRECISIONS,
    UnsupportedArgumentError,
    pool,
    quantize_embeddings,
    resolve_device,
)

SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome!",
    "Hi",
    "",
    "Attention is all you need, or so the 2017 paper by Vaswani et al. claimed in its title.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
]
ATOL = 1e-5
SMALL_FILES = (
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)

slow = pytest.mark.slow


def _st():
    warnings.filterwarnings("ignore", category=FutureWarning)
    import sentence_transformers

    return sentence_transformers


def st_quantize(*args, **kwargs):
    from sentence_transformers.util import quantize_embeddings as theirs

    return theirs(*args, **kwargs)


def _close(ours, theirs, atol=ATOL):
    ours = ours.numpy(force=True) if isinstance(ours, torch.Tensor) else np.asarray(ours)
    theirs = theirs.numpy(force=True) if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    return _st().SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def bert(minilm_dir):
    return Bert.load(minilm_dir)


@pytest.fixture(scope="module")
def floats(bert, st_model):
    """(ours, theirs): float32 embeddings of SENTENCES."""
    return bert.encode(SENTENCES), st_model.encode(SENTENCES)


@pytest.fixture(scope="module")
def variant(minilm_dir, tmp_path_factory):
    """``variant(pooling={...}, st_config={...})``: a copy of the MiniLM folder (small files
    copied, weights symlinked) with its pooling config / config_sentence_transformers.json
    replaced; -> (Bert, SentenceTransformer) on it."""
    st = _st()

    def make(*, pooling: dict | None = None, st_config: dict | None = None, with_st=True):
        folder = tmp_path_factory.mktemp("minilm")
        for name in SMALL_FILES:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(minilm_dir / name, folder / name)
        (folder / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
        if pooling is not None:
            (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        if st_config is not None:
            (folder / "config_sentence_transformers.json").write_text(json.dumps(st_config))
        theirs = st.SentenceTransformer(str(folder), device="cpu") if with_st else None
        return Bert.load(folder), theirs

    return make


# ---------------------------------------------------------------------- the signature
@slow  # (importing sentence-transformers takes seconds)
def test_encode_signature_is_a_superset_of_sentence_transformers():
    theirs = inspect.signature(_st().SentenceTransformer.encode).parameters
    ours = inspect.signature(Bert.encode).parameters
    wanted = [(p.name, p.default) for p in theirs.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    got = [(p.name, p.default) for p in ours.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert got == wanted  # same names, same order, same defaults
    for name in ("pooling", "normalize", "max_length", "progress", "batch_tokens"):
        assert ours[name].kind is inspect.Parameter.KEYWORD_ONLY and ours[name].default is None
    assert set(PRECISIONS) == _st().sentence_transformer.model.ALLOWED_PRECISIONS


# ---------------------------------------------------------------------- inputs and outputs
@slow
def test_one_str_gives_one_vector(bert, st_model):
    ours = bert.encode("A man is playing a guitar.")
    assert ours.shape == (384,) and ours.dtype == np.float32
    _close(ours, st_model.encode("A man is playing a guitar."))
    _close(bert.encode(np.str_("Hi")), st_model.encode("Hi"))


@slow
def test_sequences_of_str(bert, st_model):
    want = st_model.encode(SENTENCES)
    assert want.shape == (len(SENTENCES), 384)
    _close(bert.encode(SENTENCES), want)
    _close(bert.encode(np.array(SENTENCES)), want)  # was "truth value ... is ambiguous"
    _close(bert.encode(tuple(SENTENCES)), want)
    _close(bert.encode(s for s in SENTENCES), want)  # any iterable of str

    class Series:  # like pandas.Series: iterates values, [i] looks up a label
        def __init__(self, values):
            self.values = values

        def __iter__(self):
            return iter(self.values)

        def __len__(self):
            return len(self.values)

        def __getitem__(self, label):
            raise KeyError(label)

    _close(bert.encode(Series(SENTENCES)), want)
    _close(bert.encode(sentences=SENTENCES), want)  # sentence-transformers < 6's name


@slow
def test_normalize_embeddings_and_truncate_dim(bert, st_model):
    out = {}
    for normalize, dim in [(False, None), (False, 64), (True, 64)]:
        kw = dict(normalize_embeddings=normalize, truncate_dim=dim)
        out[normalize, dim] = bert.encode(SENTENCES, **kw)
        _close(out[normalize, dim], st_model.encode(SENTENCES, **kw))
    # the folder's Normalize module, then truncate_dim, then normalize_embeddings
    assert np.linalg.norm(out[False, 64], axis=1).max() < 0.999
    np.testing.assert_allclose(np.linalg.norm(out[True, 64], axis=1), 1.0, atol=1e-5)
    raw = bert.encode(SENTENCES, normalize=False)  # bertattn's: no Normalize module
    assert np.linalg.norm(raw, axis=1).max() > 1.5
    _close(
        bert.encode(SENTENCES, normalize=False, normalize_embeddings=True),
        st_model.encode(SENTENCES),
    )


@slow
def test_tensor_and_list_outputs(bert, st_model):
    ours = bert.encode(SENTENCES, convert_to_tensor=True)
    theirs = st_model.encode(SENTENCES, convert_to_tensor=True)
    assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype == torch.float32
    _close(ours, theirs)
    one = bert.encode("Hi", convert_to_tensor=True)
    assert isinstance(one, torch.Tensor) and one.shape == (384,)
    rows = bert.encode(SENTENCES, convert_to_numpy=False)
    their_rows = st_model.encode(SENTENCES, convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == len(their_rows) == len(SENTENCES)
    for a, b in zip(rows, their_rows, strict=True):
        assert isinstance(a, torch.Tensor)
        _close(a, b)


@slow
def test_token_embeddings(bert, st_model):
    ours = bert.encode(SENTENCES, output_value="token_embeddings")
    theirs = st_model.encode(SENTENCES, output_value="token_embeddings")
    assert isinstance(ours, list) and len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert isinstance(a, torch.Tensor) and a.shape == b.shape  # (L_i, 384): real tokens
        _close(a, b)
    single = bert.encode("Hi", output_value="token_embeddings")
    _close(single, st_model.encode("Hi", output_value="token_embeddings"))


@slow
def test_output_value_none(bert, st_model):
    """Rows as sentence-transformers gives them: its batching, each row padded to its batch."""
    ours = bert.encode(SENTENCES, output_value=None, prompt="query: ", batch_size=4)
    theirs = st_model.encode(SENTENCES, output_value=None, prompt="query: ", batch_size=4)
    for a, b in zip(ours, theirs, strict=True):
        assert list(a) == list(b)  # same keys, same order
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert torch.equal(a[key], b[key])  # padded to the batch, as theirs
        assert a["prompt_length"] == b["prompt_length"] and a["modality"] == b["modality"]
        real = b["attention_mask"].bool()
        assert a["token_embeddings"].shape == b["token_embeddings"].shape
        _close(a["token_embeddings"][real], b["token_embeddings"][real])
        _close(a["sentence_embedding"], b["sentence_embedding"])


@slow
@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_precision(bert, st_model, floats, precision):
    ours = bert.encode(SENTENCES, precision=precision)
    theirs = st_model.encode(SENTENCES, precision=precision)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    # the same arithmetic: sentence-transformers' quantize_embeddings of our float32 vectors
    floats, their_floats = floats
    assert np.array_equal(ours, st_quantize(floats, precision=precision))
    assert np.array_equal(quantize_embeddings(floats, precision), ours)
    if precision.endswith("binary"):
        assert np.array_equal(ours, theirs)
    else:
        # int8 buckets are calibrated on the batch (per dimension, 256 between min and max);
        # ours and theirs agree to ~1e-7, not bit for bit, so a value within rounding of a
        # bucket edge (every dimension's maximum lands on 255 give or take one rounding) may
        # fall one bucket apart. Anywhere else they are equal.
        lo, hi = their_floats.min(0), their_floats.max(0)
        position = (their_floats - lo) / ((hi - lo) / 255)  # bucket edges at integers
        at_edge = np.abs(position - np.round(position)) < 1e-3
        diff = ours.astype(int) - theirs.astype(int)
        assert np.abs(diff).max() <= 1
        assert at_edge[diff != 0].all()
        assert (diff != 0).mean() < 0.02
    if precision == "int8":
        tensor = bert.encode(SENTENCES, precision=precision, convert_to_tensor=True)
        assert isinstance(tensor, torch.Tensor) and np.array_equal(tensor.numpy(), ours)


@slow
def test_precision_of_one_text(bert, st_model):
    _close(bert.encode("Hi", precision="ubinary"), st_model.encode("Hi", precision="ubinary"))
    for model in (bert, st_model):  # buckets cannot be calibrated on one vector
        with pytest.raises(ValueError, match="from a single embedding"):
            model.encode("Hi", precision="int8")


@slow
def test_prompt(bert, st_model):
    ours = bert.encode(SENTENCES, prompt="query: ")
    _close(ours, st_model.encode(SENTENCES, prompt="query: "))
    assert np.abs(ours - bert.encode(SENTENCES)).max() > 0.05  # the prompt is there
    _close(ours, bert.encode(["query: " + s for s in SENTENCES]))  # prepended, and pooled
    _close(bert.encode_query(SENTENCES), st_model.encode_query(SENTENCES))  # "" here


@slow
def test_batch_size(bert, st_model):
    want = st_model.encode(SENTENCES)
    one = bert.encode(SENTENCES, batch_size=1)
    _close(one, want)
    _close(bert.encode(SENTENCES, batch_size=64), one)
    _close(bert.encode(SENTENCES, batch_size=2, batch_tokens=40), one)


@slow
def test_empty_list(bert, st_model):
    ours, theirs = bert.encode([]), st_model.encode([])
    assert len(ours) == len(theirs) == 0
    assert ours.shape == (0, 384) and ours.dtype == np.float32  # theirs: shape (0,), float64
    assert bert.encode([], convert_to_tensor=True).shape == (0, 384)
    assert bert.encode([], convert_to_numpy=False) == []
    assert bert.encode([], precision="int8").shape == (0, 384)


# ---------------------------------------------------------------------- similarity, sizes
@slow
@pytest.mark.parametrize("name", ["cosine", "dot", "euclidean", "manhattan"])
def test_similarity(bert, st_model, floats, name):
    a, b = floats[0], floats[0][::-1].copy()
    st_model.similarity_fn_name = name
    try:
        bert.similarity_fn_name = name
        want = st_model.similarity(a, b)
        got = bert.similarity(a, b)
        assert isinstance(got, torch.Tensor) and got.shape == (len(a), len(b))
        _close(got, want)
        _close(bert.similarity(torch.from_numpy(a), list(b)), want)
        _close(bert.similarity(a[0], b), st_model.similarity(a[0], b))  # a vector is one row
        _close(bert.similarity_pairwise(a, b), st_model.similarity_pairwise(a, b))
    finally:
        st_model.similarity_fn_name = "cosine"
        bert.similarity_fn_name = None
    assert bert.similarity_fn_name == "cosine"
    with pytest.raises(ValueError, match="similarity_fn_name 'maxsim' is not supported"):
        bert.similarity_fn_name = "maxsim"


@slow
def test_dimensions_and_max_seq_length(bert, st_model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # renamed in sentence-transformers 6
        assert (
            bert.get_sentence_embedding_dimension() == st_model.get_sentence_embedding_dimension()
        )
    assert bert.get_embedding_dimension() == st_model.get_embedding_dimension() == 384
    assert bert.max_seq_length == st_model.max_seq_length == bert.max_length == 256
    bert.max_seq_length = 8
    try:
        short = bert.encode(SENTENCES)
        _close(short, bert.encode(SENTENCES, max_length=8))
        assert np.abs(short - bert.encode(SENTENCES, max_length=256)).max() > 0.05
    finally:
        bert.max_seq_length = 256
    with pytest.raises(ValueError, match=r"max_seq_length must be an int in 1\.\.512"):
        bert.max_seq_length = 513


# ---------------------------------------------------------------------- folder settings
@slow
def test_max_pooling_folder(variant):
    bert, st_model = variant(
        pooling={"word_embedding_dimension": 384, "pooling_mode_max_tokens": True}
    )
    assert bert.pooling == "max"
    want = st_model.encode(SENTENCES)
    ours = bert.encode(SENTENCES, batch_size=64)  # padded: padding is not a maximum
    _close(ours, want)
    _close(bert.encode(SENTENCES, batch_size=1), want)
    assert np.abs(bert.encode(SENTENCES, pooling="mean") - want).max() > 0.05
    # the form sentence-transformers >= 6 writes
    new, _ = variant(pooling={"embedding_dimension": 384, "pooling_mode": "max"}, with_st=False)
    assert new.pooling == "max"
    _close(new.encode(SENTENCES), ours)


def test_max_pooling_ignores_padding():
    hidden = torch.tensor([[[1.0, -2.0], [3.0, -1.0], [100.0, 100.0]]])  # (1, 3, 2)
    mask = torch.tensor([[1, 1, 0]])  # the third position is padding
    assert pool(hidden, mask, "max").tolist() == [[3.0, -1.0]]
    assert pool(hidden, mask, "mean").tolist() == [[2.0, -1.5]]
    assert pool(hidden, torch.tensor([[0, 1, 1]]), "cls").tolist() == [[3.0, -1.0]]


@slow
def test_prompts_from_the_folder(variant):
    config = {
        "prompts": {"query": "query: ", "passage": "passage: "},
        "default_prompt_name": "passage",
        "similarity_fn_name": "dot",
    }
    bert, st_model = variant(st_config=config)
    assert bert.prompts == st_model.prompts and bert.default_prompt_name == "passage"
    assert bert.similarity_fn_name == st_model.similarity_fn_name == "dot"
    default = bert.encode(SENTENCES)  # the default prompt applies
    _close(default, st_model.encode(SENTENCES))
    _close(default, bert.encode(SENTENCES, prompt="passage: "))
    _close(
        bert.encode(SENTENCES, prompt_name="query"), st_model.encode(SENTENCES, prompt_name="query")
    )
    _close(bert.encode(SENTENCES, prompt=""), st_model.encode(SENTENCES, prompt=""))
    _close(bert.encode_query(SENTENCES), st_model.encode_query(SENTENCES))
    _close(bert.encode_document(SENTENCES), st_model.encode_document(SENTENCES))
    with pytest.raises(
        ValueError, match=r"Prompt name 'doc' not found.*\['query', 'document', 'passage'\]"
    ):
        bert.encode(SENTENCES, prompt_name="doc")


@slow
def test_prompt_left_out_of_pooling(variant):
    config = {"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": False}
    bert, st_model = variant(pooling=config)
    assert bert.include_prompt is False
    prompt = "Represent this sentence for retrieval: "
    for mode in ("mean", "cls", "max"):
        st_model[1].pooling_mode = mode
        ours = bert.encode(SENTENCES, prompt=prompt, pooling=mode)
        _close(ours, st_model.encode(SENTENCES, prompt=prompt))
        pooled_with_prompt = bert.encode([prompt + s for s in SENTENCES], pooling=mode)
        assert np.abs(ours - pooled_with_prompt).max() > 1e-3, mode


# ---------------------------------------------------------------------- devices
def test_devices(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint, device="cpu")
    assert bert.device == torch.device("cpu") and bert.to("cpu") is bert
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "", "cpu:0:1"):
        with pytest.raises(ValueError, match=r"is not valid; use 'auto', 'cpu', 'cuda', 'cuda:N'"):
            resolve_device(bad)
    with pytest.raises(ValueError, match="is not valid"):
        Bert.load(tiny_checkpoint, device="gpu")  # before anything is read
    assert bert.encode(["hi"], device="cpu").shape == (1, 32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_where_there_is_none(tiny_checkpoint):
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match="CUDA is not available here"):
            resolve_device(device)
    bert = Bert.load(tiny_checkpoint)
    with pytest.raises(ValueError, match="CUDA is not available here"):
        Bert.load(tiny_checkpoint, device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available here"):
        bert.encode(["hi"], device="cuda")
    assert bert.device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint)
    cpu = bert.encode(["hello world", "the attention head"])
    gpu = bert.encode(["hello world", "the attention head"], device="cuda", convert_to_tensor=True)
    assert gpu.device.type == "cuda" and bert.device.type == "cuda"  # moved for good
    np.testing.assert_allclose(gpu.cpu().numpy(), cpu, atol=1e-4)
    assert Bert.load(tiny_checkpoint, device="auto").device.type == "cuda"


# ---------------------------------------------------------------------- what is refused
def test_bad_calls(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint)
    with pytest.raises(TypeError, match="keyword argument.*: colour") as err:
        bert.encode(["hi"], colour="red")
    assert isinstance(err.value, ValueError)  # what sentence-transformers raises
    with pytest.raises(ValueError, match=r"inputs\[2\] is a int, not a str"):
        bert.encode(["a", "b", 3])
    with pytest.raises(ValueError, match=r"inputs\[1\] is a NoneType"):
        bert.encode(np.array(["a", None], dtype=object))
    with pytest.raises(UnsupportedArgumentError, match="pool= .*not supported"):
        bert.encode(["hi"], pool={"processes": []})
    with pytest.raises(UnsupportedArgumentError, match="list of devices"):
        bert.encode(["hi"], device=["cpu", "cpu"])
    with pytest.raises(UnsupportedArgumentError, match=r"processing_kwargs\['common'\]"):
        bert.encode(["hi"], processing_kwargs={"common": {"return_tensors": "np"}})
    with pytest.raises(ValueError, match="is bytes; decode it"):
        bert.encode(b"hi")
    with pytest.raises(ValueError, match="2-D numpy array of shape \\(1, 3\\)"):
        bert.encode(np.array([["a", "b", "c"]]))  # (N, 2) would be text pairs
    with pytest.raises(ValueError, match="Precision 'int4' is not supported"):
        bert.encode(["hi"], precision="int4")
    with pytest.raises(ValueError, match="output_value 'logits' is not supported"):
        bert.encode(["hi"], output_value="logits")
    # bertattn < this version took (texts, pooling, normalize, batch_size, max_length)
    with pytest.raises(ValueError, match="Did you mean pooling='cls'"):
        bert.encode(["hi"], "cls")
    with pytest.raises(ValueError, match="pass normalize= by keyword"):
        bert.encode(["hi"], None, False)
    with pytest.raises(ValueError, match="pass max_length= by keyword"):
        bert.encode(["hi"], None, None, 8, 16)
    assert bert.encode(["hi"], task="query").shape == (1, 32)  # no Router: nothing to route


def test_bertattn_keywords_still_work(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint)
    texts = ["hello world", "", "the attention head attends"]
    seen: list[int] = []
    out = bert.encode(
        texts, pooling="mean", normalize=True, max_length=4, progress=seen.append, batch_tokens=8
    )
    assert out.shape == (3, 32) and sum(seen) == 3
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    emb, stats = bert.encode_with_stats(texts, pooling="max", batch_size=2, max_length=4)
    np.testing.assert_allclose(emb, bert.encode(texts, pooling="max", max_length=4), atol=1e-6)
    assert stats.texts == 3 and stats.empty == 1 and stats.truncated >= 1
    with pytest.raises(ValueError, match="wrap a single text in a list"):
        bert.encode_with_stats("hello")
    with pytest.raises(ValueError, match="pooling 'sum' is not supported"):
        bert.encode(texts, pooling="sum")


def test_progress_bar(tiny_checkpoint, capfd):
    bert = Bert.load(tiny_checkpoint)
    logger = logging.getLogger("bertattn.encoder")
    level = logger.level
    try:
        logger.setLevel(logging.WARNING)
        bert.encode(["hi", "there"], batch_size=1)
        assert "Batches" not in capfd.readouterr().err  # off by default
        long = " ".join(["attention"] * 400)  # truncated: a batch of its own at batch_size=1
        bert.encode([long, "there"], batch_size=1, show_progress_bar=True)
        err = capfd.readouterr().err
        assert "Batches: 100%" in err and "2/2" in err
        logger.setLevel(logging.INFO)  # sentence-transformers' rule: on at INFO / DEBUG
        bert.encode(["hi"])
        assert "Batches" in capfd.readouterr().err
        bert.encode(["hi"], show_progress_bar=False)
        assert "Batches" not in capfd.readouterr().err
    finally:
        logger.setLevel(level)


@slow
def test_quantize_embeddings_matches_sentence_transformers():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((150, 24)).astype(np.float32)
    calib = rng.standard_normal((300, 24)).astype(np.float32)
    for precision in PRECISIONS:
        want = st_quantize(emb, precision=precision)
        got = quantize_embeddings(emb, precision)
        assert got.dtype == want.dtype and np.array_equal(got, want), precision
        want = st_quantize(emb, precision, calibration_embeddings=calib)
        got = quantize_embeddings(emb, precision, calibration_embeddings=calib)
        assert np.array_equal(got, want), precision
    tokens = [torch.from_numpy(emb[:40]), torch.from_numpy(emb[40:])]  # one shared calibration
    for a, b in zip(
        quantize_embeddings(tokens, "int8"),
        st_quantize(tokens, "int8"),
        strict=True,
    ):
        assert np.array_equal(a, b)
