"""The library under abuse (items of the issue "Promises under abuse"): a copied or pickled
``Bert``, ``Embeddings`` indexed as NumPy indexes, bounded thread counts, lone surrogates,
and huge texts cut before tokenizing without changing the result."""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bertattn import Bert
from bertattn.runtime.threads import ADAPTIVE_ENV, CpuBudget, ThreadChoice, choose_threads


# ---------------------------------------------------------------------- copy and pickle
@pytest.fixture
def governed_bert(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Bert:
    """A tiny Bert loaded as where ``OMP_NUM_THREADS`` is unset: with its thread governor
    (whose lock did not pickle)."""
    import torch

    from bertattn.runtime.threads import cpu_budget

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(ADAPTIVE_ENV, "1")
    # torch's count as a fresh process has it (an earlier test's module-wide Bert may have
    # left another, which the policy would then keep as the user's own, with no governor)
    torch.set_num_threads(cpu_budget().affinity)
    bert = Bert.load(tiny_checkpoint)
    assert bert.governor is not None  # the failing case: a governor with a lock
    return bert


TEXTS = ["hello world", "a second, longer text about attention"]


def test_deepcopy_of_a_governed_bert_encodes_the_same(governed_bert: Bert) -> None:
    twin = copy.deepcopy(governed_bert)
    assert twin.governor is not governed_bert.governor
    np.testing.assert_array_equal(twin.encode(TEXTS), governed_bert.encode(TEXTS))


def test_pickle_roundtrip_of_a_governed_bert_encodes_the_same(governed_bert: Bert) -> None:
    twin = pickle.loads(pickle.dumps(governed_bert))
    assert twin.governor is not None
    np.testing.assert_array_equal(twin.encode(TEXTS), governed_bert.encode(TEXTS))
    # the copy's governor still governs: its lock works
    with twin.governor.batch(10) as n:
        assert n >= 1


def _encode_in_worker(blob: bytes) -> np.ndarray:
    return pickle.loads(blob).encode(TEXTS)


@pytest.mark.slow
def test_a_spawned_worker_encodes_with_a_pickled_bert(governed_bert: Bert) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        rows = pool.apply(_encode_in_worker, (pickle.dumps(governed_bert),))
    np.testing.assert_allclose(rows, governed_bert.encode(TEXTS), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------- thread counts
def _choose(environ: dict[str, str], threads: int | None = None) -> ThreadChoice:
    return choose_threads(threads, environ=environ, budget=CpuBudget(2), current=2)


@pytest.mark.parametrize("threads", [10**9, 100_000])
def test_an_explicit_thread_count_beyond_the_cap_is_refused(threads: int) -> None:
    with pytest.raises(ValueError, match=rf"threads {threads} is more threads than bertattn runs"):
        _choose({}, threads)


def test_the_cap_is_8_per_cpu_and_at_least_64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _choose({}, 64).threads == 64
    with pytest.raises(ValueError, match=r"at most 64 \(8 per CPU of this machine's 2"):
        _choose({}, 65)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert _choose({}, 128).threads == 128
    with pytest.raises(ValueError, match="at most 128"):
        _choose({}, 129)


def test_bert_load_refuses_a_billion_threads_before_reading(tmp_path: Path) -> None:
    # the folder does not exist: the thread count is refused before anything is read
    with pytest.raises(ValueError, match="more threads than bertattn runs"):
        Bert.load(tmp_path / "missing", threads=10**9)


def test_omp_num_threads_beyond_the_cap_is_clamped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.warns(UserWarning, match="OMP_NUM_THREADS=999 is more threads .* using 64"):
        choice = _choose({"OMP_NUM_THREADS": "999"})
    assert choice.threads == 64 and not choice.adaptive
    assert choice.source == "OMP_NUM_THREADS=999, clamped to 64"
    assert _choose({"OMP_NUM_THREADS": "3"}).threads == 3  # within the cap: as given


@pytest.mark.parametrize(
    ("value", "adaptive"),
    [("1", True), ("TRUE", True), ("On", True), ("yes", True), ("", True), (" 0 ", False)]
    + [("False", False), ("OFF", False), ("no", False)],
)
def test_adaptive_threads_accepts_the_documented_values(value: str, adaptive: bool) -> None:
    assert _choose({ADAPTIVE_ENV: value}).adaptive is adaptive


@pytest.mark.parametrize("value", ["garbage", "2", "nope", "offf"])
def test_adaptive_threads_refuses_anything_else(value: str) -> None:
    with pytest.raises(ValueError, match=rf"{ADAPTIVE_ENV}='{value}' is not one of 1/0"):
        _choose({ADAPTIVE_ENV: value})


@pytest.mark.parametrize("command", ["serve", "encode"])
def test_cli_threads_beyond_the_cap_is_one_line_exit_2(cli, tmp_path: Path, command: str) -> None:
    argv = ["--model", tmp_path / "never-read", "--threads", "100000"]
    if command == "encode":
        argv = [tmp_path / "in.txt", "-o", tmp_path / "out.npy", *argv]
        (tmp_path / "in.txt").write_text("hello\n")
    r = cli(command, *argv)
    assert r.code == 2, r
    assert "--threads 100000 is more threads than bertattn runs" in r.err, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r


def test_bench_threads_beyond_the_cap_is_one_line_exit_2(cli) -> None:
    r = cli("bench", "--threads", "100000")
    assert r.code == 2, r
    assert "--threads 100000 is more threads than bertattn runs" in r.err, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r


def test_cli_adaptive_threads_garbage_is_one_line_exit_2(cli, tiny_checkpoint: Path, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    r = cli(
        "encode",
        tmp_path / "in.txt",
        "-o",
        tmp_path / "out.npy",
        "--model",
        tiny_checkpoint,
        env={ADAPTIVE_ENV: "garbage"},
    )
    assert r.code == 2, r
    assert f"{ADAPTIVE_ENV}='garbage' is not one of" in r.err and "Traceback" not in r.err, r


# ---------------------------------------------------------------------- huge texts: cut first
#: texts far longer than the budget (16 characters per needed token), each built to trip a
#: cut that would change the tokens: whitespace runs, no spaces at all, words that normalize
#: away or grow, words of many pieces or over WordPiece's 100 characters, special tokens
LONG_TEXTS = {
    "english": "hello world, this is a sentence. " * 700,
    "whitespace-runs": "a" + " " * 30_000 + "b c\t\t\n\r d " * 300 + "\n" * 9000 + "end " * 400,
    "leading-whitespace": " " * 60_000 + "the words come late " * 200,
    "cjk": "日本語の文章です。中文句子没有空格" * 1500,
    "cjk-no-punct": "汉字" * 9000,
    "accents": "café naïve résumé Ångström e\u0301te\u0301 " * 800,
    "combining-run": "a" + "\u0301" * 20_000 + " b" * 3000,
    "emoji": "😀🎉 👍🏽 family👨‍👩‍👧 flags🇫🇷 " * 1200,
    "many-pieces": "supercalifragilisticexpialidocious antidisestablishmentarianism " * 400,
    "over-100-chars": ("x" * 150 + " ") * 300 + ("y" * 99 + " ") * 200,
    "one-huge-word": "z" * 60_000,
    "specials": "[MASK] [SEP] hello [CLS] ab[MASK]cd [PAD]" * 900,
    "glued-specials": "ab[MASK]" * 6000,
    "controls": "a\x00b\x1cc\u200bd\ufffde\x7f " * 2500,
    "casing": "ΣΊΣΥΦΟΣ ΣΣ İstanbul ǅemal ß ﬁne " * 1200,
    "punctuation": "!?.,;:'\"()[]{}" * 3000,
    "digits": "1234567890" * 5000,
    "no-word-end-tail": "short words first " * 20 + "w" * 80_000,
}


@pytest.fixture(scope="module")
def tokenizers_pair(minilm_dir: Path):
    """bertattn's tokenizer and a reference ``tokenizers.Tokenizer`` of the same file, which
    always tokenizes the whole text."""
    from tokenizers import Tokenizer

    from bertattn.encoder.tokenizer import BertTokenizer

    ours = BertTokenizer.from_folder(minilm_dir)
    reference = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    reference.no_padding()
    return ours, reference


def _whole(reference, texts: list[str], pairs: list[str] | None, limit: int) -> list:
    reference.enable_truncation(limit, strategy="longest_first")
    return reference.encode_batch(texts if pairs is None else list(zip(texts, pairs, strict=True)))


def _same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.ids == w.ids
        assert g.type_ids == w.type_ids
        assert g.tokens == w.tokens
        assert g.offsets == w.offsets
        assert g.special_tokens_mask == w.special_tokens_mask
        assert bool(g.overflowing) == bool(w.overflowing)


@pytest.mark.parametrize("limit", [8, 64, 512])
@pytest.mark.parametrize("name", sorted(LONG_TEXTS))
def test_a_cut_text_tokenizes_as_the_whole_text(tokenizers_pair, name: str, limit: int) -> None:
    ours, reference = tokenizers_pair
    texts = [LONG_TEXTS[name], "a short text"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ours.encode_batch(texts, max_length=limit)
    _same(got, _whole(reference, texts, None, limit))


PAIRS = [
    ("english", "cjk"),
    ("whitespace-runs", "english"),
    ("many-pieces", "specials"),
    ("emoji", "accents"),
    ("combining-run", "over-100-chars"),
]


@pytest.mark.parametrize("limit", [9, 64, 512])
@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_cut_pairs_truncate_as_the_whole_pairs(tokenizers_pair, first, second, limit) -> None:
    ours, reference = tokenizers_pair
    # past the budget (16 characters per token), yet short enough for the reference: a whole
    # pair's overflowing encodings multiply (each window of one with each of the other)
    n = 40 * (limit + 1)
    a, b = LONG_TEXTS[first][-n:], LONG_TEXTS[second][-n:]
    texts = [a, "a short one", a, b[: 4 * limit]]
    pairs = [b, b, "two words", a[: 8 * limit]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ours.encode_batch(texts, pairs, max_length=limit)
    _same(got, _whole(reference, texts, pairs, limit))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("x " * 1300, "x " * 1300),  # a tie: the second text gets the odd token
        ("x " * 1301, "x " * 1300),
        ("x " * 1300, "x " * 1301),
        (" " * 3000 + "x " * 1400, "x y, " * 500),  # sparse and longer vs dense and shorter
        ("x y, " * 500, " " * 3000 + "x " * 1600),
        ("x " * 1300, "x " * 200),  # one long, one just past the room
        ("x " * 200, "x " * 1300),
    ],
)
def test_a_cut_pair_keeps_which_text_is_longer(tokenizers_pair, first: str, second: str) -> None:
    ours, reference = tokenizers_pair
    for limit in (64, 65, 128, 129):  # rooms of 61, 62, 125, 126 tokens: odd and even
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = ours.encode_batch([first], [second], max_length=limit)
        _same(got, _whole(reference, [first], [second], limit))


class _Spy:
    """A ``tokenizers.Tokenizer`` stand-in that records the longest text it was given."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.longest = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _seen(self, inputs) -> None:
        for item in inputs:
            for text in item if isinstance(item, tuple) else (item,):
                self.longest = max(self.longest, len(text))

    def encode_batch(self, inputs, *args, **kwargs):
        self._seen(inputs)
        return self.inner.encode_batch(inputs, *args, **kwargs)

    def encode(self, text, *args, **kwargs):
        self._seen([text, *args[:1]])
        return self.inner.encode(text, *args, **kwargs)


def test_a_huge_text_reaches_the_tokenizer_cut_to_the_budget(tokenizers_pair) -> None:
    ours, reference = tokenizers_pair
    huge = "hello world " * 50_000  # 600,000 characters, 100,000 tokens
    spy = _Spy(ours._tok)
    twin = copy.copy(ours)
    twin._tok = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = twin.encode_batch([huge, huge[:50]], max_length=256)
    # 16 characters per token needed (257), to the next word end: never the whole text
    assert 0 < spy.longest <= 16 * 257 + len("hello "), spy.longest
    _same(got, _whole(reference, [huge, huge[:50]], None, 256))


# ---------------------------------------------------------------------- the server's tokens
def _server_refusal(bert, texts: list[str], *, truncate: bool = False):
    from bertattn.serve.errors import ApiError
    from bertattn.serve.tokens import tokenize

    with pytest.raises(ApiError) as info:
        tokenize(bert, texts, 16, truncate, "input")
    return info.value


def test_truncate_false_names_the_true_token_count(tokenizers_pair) -> None:
    ours, reference = tokenizers_pair
    text = "hello world, " * 1000  # past the budget: cut before tokenizing, counted apart
    reference.no_truncation()
    want = len(reference.encode(text).ids)  # 3002: [CLS], 3 tokens x 1000, [SEP]
    error = _server_refusal(SimpleNamespace(tokenizer=ours), ["fine", text])
    assert error.status == 400 and error.param == "input[1]" and error.code == "input_too_long"
    assert f"has {want} tokens, more than this server's limit of 16" in error.message


def test_truncate_false_says_more_than_past_the_count_limit(tokenizers_pair) -> None:
    from bertattn.serve.tokens import COUNT_MOST

    ours, _ = tokenizers_pair
    huge = "hello world " * 850_000  # 10 MB, 1,700,002 tokens: once reported as "1000000"
    spy = _Spy(ours._tok)
    twin = copy.copy(ours)
    twin._tok = spy
    error = _server_refusal(SimpleNamespace(tokenizer=twin), [huge])
    assert f"has more than {COUNT_MOST} tokens, more than this server's limit" in error.message
    assert spy.longest < 40 * COUNT_MOST  # the count read a bounded prefix, not 10 MB


def test_the_server_refuses_a_lone_surrogate_naming_input_and_position(tokenizers_pair):
    ours, _ = tokenizers_pair
    for truncate in (True, False):
        error = _server_refusal(
            SimpleNamespace(tokenizer=ours), ["ok", "caf\udce9 x"], truncate=truncate
        )
        assert error.status == 400 and error.param == "input[1]" and error.code == "invalid_text"
        assert "'input[1]' holds a lone surrogate (U+DCE9) at character 3" in error.message


def test_post_tokenize_refuses_a_lone_surrogate(tokenizers_pair) -> None:
    from bertattn.serve.errors import ApiError
    from bertattn.serve.tokens import token_pieces

    ours, _ = tokenizers_pair
    with pytest.raises(ApiError, match=r"'inputs\[0\]' holds a lone surrogate \(U\+D800\)"):
        token_pieces(SimpleNamespace(tokenizer=ours), ["\ud800"], 16, False)


# ---------------------------------------------------------------------- lone surrogates
@pytest.fixture(scope="module")
def tiny_bert(tiny_checkpoint: Path) -> Bert:
    return Bert.load(tiny_checkpoint, threads=1)


@pytest.mark.parametrize(
    ("texts", "where"),
    [
        (["\ud800"], r"texts\[0\] holds a lone surrogate \(U\+D800\) at character 0"),
        (["fine", "caf\udce9"], r"texts\[1\] holds a lone surrogate \(U\+DCE9\) at character 3"),
        (["ok", "ok", "a \udfff b"], r"texts\[2\] holds a lone surrogate \(U\+DFFF\) at char"),
    ],
)
def test_encode_refuses_a_lone_surrogate_naming_index_and_position(tiny_bert, texts, where):
    with pytest.raises(ValueError, match=where) as info:
        tiny_bert.encode(texts)
    assert "errors='replace'" in str(info.value)  # the fix


def test_a_valid_astral_character_is_not_a_surrogate(tiny_bert) -> None:
    assert tiny_bert.encode(["emoji 😀 and 𝔘"]).shape[0] == 1  # one code point each in Python


def test_tokenizer_names_a_surrogate_in_pairs(tokenizers_pair) -> None:
    from bertattn.encoder.tokenizer import InvalidTextError

    ours, _ = tokenizers_pair
    with pytest.raises(InvalidTextError, match=r"pairs\[1\] holds a lone surrogate") as info:
        ours.encode_batch(["a", "b"], ["c", "d\ud83d"])
    assert (info.value.field, info.value.index, info.value.position) == ("pairs", 1, 1)


# ---------------------------------------------------------------------- arguments not UTF-8
NOT_UTF8 = "caf\udce9"  # what Python makes of the bytes caf\xe9 (latin-1) in argv


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["attend", NOT_UTF8], "TEXT"),
        (["attend", "fine", "--pair", NOT_UTF8], "--pair"),
        (["attend", "fine", "--explain", f"0:0:{NOT_UTF8}"], "--explain"),
        (["serve", "--served-model-name", NOT_UTF8], "--served-model-name"),
        (["serve", "--api-key", NOT_UTF8], "--api-key"),
        (["encode", "in.txt", "-o", "o.jsonl", "--field", NOT_UTF8], "--field"),
        (["encode", "in.txt", "-o", "o.jsonl", "--id-field", NOT_UTF8], "--id-field"),
    ],
)
def test_a_text_argument_not_utf8_is_one_line_exit_2(cli, tmp_path: Path, argv, flag) -> None:
    (tmp_path / "in.txt").write_text("hello\n")
    r = cli(*argv, "--model", tmp_path / "never-read", cwd=tmp_path)
    assert r.code == 2, r
    assert f"{flag} is not valid UTF-8 (byte 0xE9 at character" in r.err, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r


@pytest.mark.slow
def test_attend_with_latin1_bytes_in_argv_exits_2(cli_subprocess) -> None:
    r = cli_subprocess("attend", NOT_UTF8, timeout=120)  # the child gets the byte 0xE9
    assert r.code == 2, r
    assert "TEXT is not valid UTF-8 (byte 0xE9 at character 3)" in r.err, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r


# ---------------------------------------------------------------------- serve: before loading
@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Bert.load`` fails the test if it is called: these refusals come before the weights."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Bert.load was called before the options were checked")

    monkeypatch.setattr(Bert, "load", refuse)


def _one_line_exit_2(r, message: str) -> None:
    assert r.code == 2, r
    assert message in r.err, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r


def test_serve_a_folder_that_is_no_model_exits_2_as_encode_says(cli, tmp_path, no_model_load):
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "passwd").write_text("root:x:0:0\n")
    r = cli("serve", "--model", folder, "--port", "0")
    _one_line_exit_2(r, f"{folder}: no config.json; pass a Hugging Face BERT folder")


def test_encode_gives_the_same_words_for_a_folder_that_is_no_model(cli, tmp_path) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    (tmp_path / "in.txt").write_text("hello\n")
    encode = cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.npy", "--model", folder)
    assert f"{folder}: no config.json; pass a Hugging Face BERT folder" in encode.err, encode


def test_serve_a_file_as_model_exits_2(cli, tmp_path, no_model_load) -> None:
    (tmp_path / "passwd").write_text("root:x:0:0\n")
    r = cli("serve", "--model", tmp_path / "passwd", "--port", "0")
    _one_line_exit_2(r, f"{tmp_path / 'passwd'} is a file; pass the model folder")


def test_serve_max_batch_tokens_below_the_model_is_refused_before_loading(
    cli, tiny_checkpoint, no_model_load
) -> None:
    r = cli("serve", "--model", tiny_checkpoint, "--port", "0", "--max-batch-tokens", "10")
    _one_line_exit_2(
        r, "--max-batch-tokens 10 is less than the longest input, 128 tokens (the model's max"
    )
    r = cli("serve", "--model", tiny_checkpoint, "--port", "0", "--max-input-tokens", "1000")
    _one_line_exit_2(r, "--max-input-tokens 1000 is more than the model takes (128 tokens)")


def test_expected_max_length_is_what_bert_load_gives(tiny_checkpoint, minilm_dir) -> None:
    from bertattn.encoder.folder import resolve_model
    from bertattn.jobs.serve_checks import expected_max_length

    for path, want in ((tiny_checkpoint, 128), (minilm_dir, 256)):
        assert expected_max_length(resolve_model(path)) == want
        assert Bert.load(path, threads=1).max_length == want
