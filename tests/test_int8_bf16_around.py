"""int8 with bfloat16 around its products (``int8_around``: bertattn.encoder.int8_around).

Which dtype ``"auto"`` puts around the products and why; the argument checks; the tiny random
model with bfloat16 around its int8 steps (eager, the product exact: on every CPU); the default
MiniLM with bfloat16 around oneDNN's int8 kernels (where int8 runs here), held against float32
no further than plain bfloat16's distance plus plain int8's, both measured here; the load-time
fidelity check of the mix, its refusal, ``"auto"``'s way back to float32, and the mix named
where the int8 form is. bfloat16 is emulated on CPUs without AVX512_BF16 or AMX: the inputs
stay small."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from test_int8 import REFUSED, _rel
from test_int8_blocks import folder  # noqa: F401  (a fixture: the block families' folders)
from test_int8_speed import int8_steps  # noqa: F401  (a fixture, used by name)

from benchmarks.corpus import stdlib_docstring_corpus
from bertattn import Bert
from bertattn.encoder import int8, int8_around, int8_speed
from bertattn.encoder.auto_dtype import DtypeChoice, choose_dtype, flag_rule
from bertattn.encoder.int8 import CALIBRATION, Int8BertLayer
from bertattn.encoder.int8_around import FLOAT32_AROUND, Around, choose_around
from bertattn.runtime.cpu import cpu_capability

MINILM = (384, 1536)  # all-MiniLM-L6-v2's hidden and intermediate widths
AMX = {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile"}
AVX2 = {"avx2", "fma", "f16c"}


@pytest.fixture(autouse=True)
def _own_speed():
    """check_speed() measures once per process: each test starts without the measurement (the
    eager tests fake theirs), and the process's own is put back after."""
    kept = dict(int8_speed._speeds)
    int8_speed._speeds.clear()
    yield
    int8_speed._speeds.clear()
    int8_speed._speeds.update(kept)


def _arounds(bert: Bert) -> set[torch.dtype]:
    return {la.around for la in bert.model.encoder.layers if isinstance(la, Int8BertLayer)}


def _embed(bert: Bert, texts: list[str]) -> torch.Tensor:
    with torch.inference_mode():
        return bert.encode(texts, convert_to_tensor=True, normalize_embeddings=True)


def _plain_bf16(path) -> Bert:  # type: ignore[no-untyped-def]
    """The same model in plain bfloat16 (products in bf16), the warning of a CPU that
    emulates bf16 silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Bert.load(path, dtype="bfloat16", threads=1)


def _distances(bert: Bert, plain: Bert, texts: list[str]) -> dict[str, float]:
    """Each embedding's distance from the float32 path of ``bert`` (int8, bfloat16 around):
    the mix's, plain int8's (float32 around the same products) and ``plain`` bfloat16's."""
    mix = bert.model.int8_around
    with int8.float32_path(bert.model):
        ref = _embed(bert, texts)
    got = _embed(bert, texts)
    int8.use_around(bert.model, FLOAT32_AROUND)
    try:
        int8_f32 = _embed(bert, texts)
    finally:
        int8.use_around(bert.model, mix)
    return {
        "mix": _rel(got, ref),
        "int8": _rel(int8_f32, ref),
        "bf16": _rel(_embed(plain, texts), ref),
        "mix_vs_int8": _rel(got, int8_f32),
    }


# ---------------------------------------------------------------------- choosing the mix
def test_explicit_values_are_taken_as_given() -> None:
    assert choose_around("float32") == Around(torch.float32, "int8_around='float32'")
    mix = choose_around("bfloat16")
    assert (mix.dtype, mix.auto) == (torch.bfloat16, False)
    assert str(mix) == "bfloat16 around them (int8_around='bfloat16')"


@pytest.mark.parametrize(("flags", "want"), [(AMX, torch.bfloat16), (AVX2, torch.float32)])
def test_auto_takes_what_dtype_auto_takes_for_the_flags(flags, want) -> None:
    """With the probe off, ``dtype="auto"`` follows the CPU's flags: bfloat16 with AMX, float32
    where bf16 is emulated; ``int8_around="auto"`` takes the same, and says why."""
    rule = flag_rule(flags)
    got = choose_around("auto", choice=rule)
    assert (got.dtype, got.auto) == (want, True)
    assert got.reason == f"auto: {rule.reason}"


def test_auto_on_this_cpu() -> None:
    """Where this CPU's flags have no native bf16 matrix product (an AVX2 Zen 3), float32
    stays around the int8 products, as before ``int8_around``; where they have one, whatever
    the timed ``dtype="auto"`` takes at MiniLM's widths."""
    got = choose_around("auto", widths=MINILM, threads=1)
    assert got.auto and got.reason.startswith("auto: ")
    if cpu_capability()["bf16_matmul"] != "native":
        assert got.dtype == torch.float32, got
    else:
        assert got.dtype == choose_dtype("cpu", widths=MINILM, threads=1).dtype, got


def test_block_families_keep_float32_and_refuse_bfloat16_by_name() -> None:
    with pytest.raises(ValueError) as info:
        choose_around("bfloat16", blocks="gte's EncoderBlock")
    assert str(info.value) == (
        "int8_around='bfloat16' covers BERT's int8 layer only; this model's layers are gte's "
        "EncoderBlock, whose int8 products keep float32 around them: pass "
        "int8_around='float32' or 'auto'."
    )
    fast_bf16 = DtypeChoice(torch.bfloat16, "bf16 1.62x fp32")
    auto = choose_around("auto", blocks="gte's EncoderBlock", choice=fast_bf16)
    assert auto.dtype == torch.float32
    assert auto.reason == "auto: gte's EncoderBlock layers keep float32 around their int8 products"
    assert choose_around("float32", blocks="gte's EncoderBlock") == FLOAT32_AROUND


@pytest.mark.slow  # a random folder of each block family, saved by transformers
def test_a_block_family_refuses_bfloat16_around_untimed(folder, monkeypatch) -> None:  # noqa: F811
    def must_not_run() -> None:
        raise AssertionError("timed although the mix is refused")

    monkeypatch.setattr(int8, "available", lambda: None)
    monkeypatch.setattr(int8, "check_speed", must_not_run)
    with pytest.raises(ValueError) as info:
        Bert.load(folder, dtype="int8", int8_around="bfloat16", threads=1)
    family = Bert.load(folder, threads=1).model.config.family
    assert str(info.value) == (
        f"int8_around='bfloat16' covers BERT's int8 layer only; this model's layers are "
        f"{family}'s EncoderBlock, whose int8 products keep float32 around them: pass "
        f"int8_around='float32' or 'auto'."
    )


def test_load_checks_int8_around_before_reading_anything(tmp_path) -> None:
    missing = tmp_path / "not-a-model"  # a folder that is not there: read, it would say so
    with pytest.raises(ValueError) as info:
        Bert.load(missing, int8_around="bfloat16")
    assert str(info.value) == (
        "int8_around='bfloat16' applies to dtype='int8' only; pass dtype='int8' with it, or "
        "leave int8_around out."
    )
    with pytest.raises(ValueError) as info:
        Bert.load(missing, dtype="int8", int8_around="float16")
    assert str(info.value) == (
        "int8_around 'float16' is not supported; use one of 'auto', 'float32', 'bfloat16'."
    )
    with pytest.raises(TypeError, match="int8_around must be one of 'auto', 'float32'"):
        Bert.load(missing, dtype="int8", int8_around=torch.bfloat16)


def test_bench_says_what_auto_puts_around_int8_here(monkeypatch) -> None:
    """``bertattn bench``'s line for ``--dtype int8`` (:func:`int8.verdict`): the form, then the
    mix ``"auto"`` takes and why."""
    from test_int8_speed import speed

    kept = speed(0.001, 0.003)
    monkeypatch.setattr(int8, "available", lambda: None)
    monkeypatch.setattr(int8, "check_speed", lambda: kept)
    fast = DtypeChoice(torch.bfloat16, "bf16 1.62x fp32 (timed)")
    monkeypatch.setattr(int8_around, "choose_dtype", lambda *a, **k: fast)
    assert int8.verdict() == (
        f"runs as {kept}; bfloat16 around them (auto: bf16 1.62x fp32 (timed))"
    )


# ---------------------------------------------------------------------- the tiny model
@pytest.mark.usefixtures("int8_steps")
def test_tiny_model_with_bfloat16_around_its_int8_steps(tiny_checkpoint, caplog) -> None:
    """The residual stream between the int8 layers is bfloat16 (the model's output is), the
    embeddings stay as close to float32 as bf16's and int8's distances together, and the mix
    differs from float32 around the same products (the bf16 steps ran). ``-v`` logs the mix."""
    with caplog.at_level("INFO", logger="bertattn.encoder.int8"):
        bert = Bert.load(tiny_checkpoint, dtype="int8", int8_around="bfloat16", threads=1)
    logged = "int8 products with bfloat16 around them (int8_around='bfloat16')"
    assert logged in caplog.messages, caplog.messages
    assert _arounds(bert) == {torch.bfloat16}
    assert bert.model.int8_around == Around(torch.bfloat16, "int8_around='bfloat16'")
    batch = bert.tokenizer(["a short text", "and another, longer text than that"])
    with torch.inference_mode():
        out = bert.model(batch.input_ids, batch.attention_mask).last_hidden_state
        with int8.float32_path(bert.model):
            ref = bert.model(batch.input_ids, batch.attention_mask).last_hidden_state
    assert (out.dtype, ref.dtype) == (torch.bfloat16, torch.float32)
    texts = [*CALIBRATION[:6], "a longer text " * 10]
    d = _distances(bert, _plain_bf16(tiny_checkpoint), texts)
    assert d["mix"] <= d["bf16"] + d["int8"], d
    assert d["mix_vs_int8"] > 0, d


@pytest.mark.usefixtures("int8_steps")
def test_a_bfloat16_mix_survives_deepcopy_and_pickle(tiny_checkpoint) -> None:
    """A copy keeps the mix (each layer's dtype around its products and the model's record of
    it) and computes what the original does."""
    import copy
    import io

    bert = Bert.load(tiny_checkpoint, dtype="int8", int8_around="bfloat16", threads=1)
    batch = bert.tokenizer(["a short text", "and another, longer text than that"])
    with torch.inference_mode():
        want = bert.model(batch.input_ids, batch.attention_mask).last_hidden_state
    buf = io.BytesIO()
    torch.save(bert.model, buf)
    buf.seek(0)
    for other in (copy.deepcopy(bert.model), torch.load(buf, weights_only=False)):
        assert other.int8_around == bert.model.int8_around
        assert {la.around for la in other.encoder.layers if isinstance(la, Int8BertLayer)} == {
            torch.bfloat16
        }
        with torch.inference_mode():
            got = other(batch.input_ids, batch.attention_mask).last_hidden_state
        assert torch.equal(got, want)


@pytest.mark.usefixtures("int8_steps")
def test_attention_weights_asked_of_a_later_layer_read_the_bfloat16_stream(tiny_checkpoint) -> None:
    """Layer 0 runs int8 with bfloat16 out; layer 1, asked for its weights, runs its float32
    layer on that stream widened back to float32."""
    bert = Bert.load(tiny_checkpoint, dtype="int8", int8_around="bfloat16", threads=1)
    batch = bert.tokenizer(["attention maps of the second layer"])
    with torch.inference_mode():
        out = bert.model(batch.input_ids, batch.attention_mask, output_attentions=[1])
    assert out.attentions[0] is None and out.attentions[1].dtype == torch.float32
    assert out.last_hidden_state.dtype == torch.float32  # the float32 layer's output
    assert torch.isfinite(out.last_hidden_state).all()


def _mix_falls_short(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The fidelity check measures a min cosine of 0.5 whenever the model loading has bfloat16
    around its products (its real numbers otherwise)."""
    loading: list[Bert] = []
    real_quantize, real_compare = int8.quantize_model, int8.compare

    def quantize(bert: Bert, **kw: object) -> Bert:
        loading.append(bert)
        return real_quantize(bert, **kw)  # type: ignore[arg-type]

    def compare(reference: torch.Tensor, got: torch.Tensor) -> int8.Fidelity:
        fid = real_compare(reference, got)
        mix = loading[-1].model.int8_around.dtype
        return dataclasses.replace(fid, min_cosine=0.5) if mix == torch.bfloat16 else fid

    monkeypatch.setattr(int8, "quantize_model", quantize)
    monkeypatch.setattr(int8, "compare", compare)


@pytest.mark.usefixtures("int8_steps")
def test_a_bfloat16_mix_that_falls_short_is_refused(tiny_checkpoint, monkeypatch) -> None:
    _mix_falls_short(monkeypatch)
    with pytest.raises(ValueError) as info:
        Bert.load(tiny_checkpoint, dtype="int8", int8_around="bfloat16", threads=1)
    msg = str(info.value)
    assert (
        " with bfloat16 around its products is refused: against float32 on 66 texts: min "
        "cosine 0.50000 (bar 0.99), mean cosine "
    ) in msg, msg
    assert msg.endswith(
        "Load it with int8_around='float32', or in float32 (or bfloat16), instead."
    ), msg


@pytest.mark.usefixtures("int8_steps")
def test_auto_falls_back_to_float32_around_when_bfloat16_falls_short(
    tiny_checkpoint, monkeypatch
) -> None:
    """On a CPU where ``"auto"`` takes bfloat16, a mix below the bars is not a refusal: the
    model loads with float32 around its products, and its reason says why."""
    _mix_falls_short(monkeypatch)
    fast = DtypeChoice(torch.bfloat16, "bf16 1.62x fp32 (timed)")
    monkeypatch.setattr(int8_around, "choose_dtype", lambda *a, **k: fast)
    bert = Bert.load(tiny_checkpoint, dtype="int8", threads=1)  # int8_around="auto"
    assert _arounds(bert) == {torch.float32}
    reason = bert.model.int8_around.reason
    assert reason.startswith("auto: bfloat16 around fell short of the fidelity bars (min cosine "
                             "0.5000, mean "), reason  # fmt: skip
    assert bert.dtype_reason.endswith(f"; float32 around them ({reason})")


# ---------------------------------------------------------------------- MiniLM, oneDNN's int8
@pytest.fixture(scope="module")
def minilm_mix(minilm_dir) -> Bert:
    """MiniLM in int8 with bfloat16 around, verified as it loads. Skipped, with the numbers,
    only where this CPU's int8 is refused (the timing) or falls short with float32 around too
    (the load-time bars): there the mix is not what fails."""
    if REFUSED is not None:
        pytest.skip(REFUSED)
    try:
        return Bert.load(minilm_dir, dtype="int8", int8_around="bfloat16", threads=1)
    except ValueError as exc:
        try:
            Bert.load(minilm_dir, dtype="int8", int8_around="float32", threads=1)
        except ValueError as plain:
            pytest.skip(f"int8 refused on this CPU with float32 around too: {plain}")
        raise exc


@pytest.mark.slow
def test_minilm_mix_passes_the_fidelity_check(minilm_mix: Bert) -> None:
    assert _arounds(minilm_mix) == {torch.bfloat16}
    fid = int8.verify(minilm_mix)  # as at load: the same bars
    assert fid.passes() and fid.texts == len(CALIBRATION)
    assert fid.min_cosine >= int8.MIN_COSINE and fid.mean_cosine >= int8.MEAN_COSINE
    assert fid.min_cosine < 0.99999  # the int8 path ran


@pytest.mark.slow
def test_minilm_mix_is_as_close_as_bf16_and_int8_together(minilm_mix: Bert, minilm_dir) -> None:
    short = [t for t in stdlib_docstring_corpus(400) if 8 <= len(t.split()) <= 20][:24]
    assert len(short) == 24 and not set(short) & set(CALIBRATION)
    d = _distances(minilm_mix, _plain_bf16(minilm_dir), short)
    assert d["mix"] <= d["bf16"] + d["int8"], d
    assert d["mix_vs_int8"] > 0, d


@pytest.mark.slow
def test_explain_and_the_dtype_reason_name_the_mix(minilm_mix: Bert) -> None:
    import bertattn

    form = minilm_mix.model.int8_speed
    want = f"int8 products as {form}; bfloat16 around them (int8_around='bfloat16')"
    assert minilm_mix.dtype_reason == want  # what /info and encode's manifest show
    with bertattn.explain() as log, torch.inference_mode():
        minilm_mix.encode(["one text"])
    assert f"encode: {want}" in log.notes, log.notes
