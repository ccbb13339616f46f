"""CUDA graphs for BertModel inference (bertattn.encoder.graphs).

On the CPU a graph is replaced by an eager stand-in that reruns the captured function, inside
``capturing()`` and under a guard that fails on any read of a tensor's value back to the host
(what a real capture forbids). That checks the bucketing, the padding of rows and columns, the
branch-free mask path and the bookkeeping; the real capture runs in the CUDA tests at the end,
which skip without a CUDA device.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from tiny_bert import TINY, tiny_bertattn
from torch import Tensor

from bertattn import BertModel
from bertattn.capture import capturing, is_capturing
from bertattn.encoder.graphs import GraphedBert, bucket_batch, bucket_length

_GUARD = [False]


class HostRead(RuntimeError):
    """A tensor value was read back to the host while 'capturing'."""


def _refusing(name: str, original: Callable) -> Callable:
    def method(*args, **kwargs):  # type: ignore[no-untyped-def]
        if _GUARD[0]:
            raise HostRead(f"{name} read a tensor's value during capture")
        return original(*args, **kwargs)

    return method


@pytest.fixture
def host_read_guard(monkeypatch) -> Iterator[None]:
    """While ``_GUARD[0]`` is set, every way of reading a tensor value raises HostRead."""
    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, _refusing(name, getattr(torch.Tensor, name)))
    for name in ("nonzero", "count_nonzero"):
        monkeypatch.setattr(torch, name, _refusing(name, getattr(torch, name)))
    yield
    _GUARD[0] = False


@contextmanager
def _guarded() -> Iterator[None]:
    _GUARD[0] = True
    try:
        with capturing():
            yield
    finally:
        _GUARD[0] = False


def eager_capture(fn, device, pool):  # type: ignore[no-untyped-def]
    """A stand-in for cuda_capture: replay reruns ``fn`` into the same output tensor."""
    with _guarded():
        output = fn()

    def replay() -> None:
        with _guarded():
            output.copy_(fn())

    return replay, output


def _model(dtype: torch.dtype = torch.float32, **kw: object) -> BertModel:
    return tiny_bertattn(**kw).to(dtype)


def _batch(b: int, length: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, TINY["vocab_size"], (b, length), generator=g)
    lengths = torch.randint(1, length + 1, (b,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    types = torch.randint(0, 2, (b, length), generator=g) * mask
    return ids * mask, mask, types


def _err(a: Tensor, ref: Tensor, mask: Tensor | None = None) -> float:
    """Max abs difference, at the real tokens only when ``mask`` is given (what a padding
    position holds depends on the layout: zeros when a CPU batch runs packed)."""
    diff = (a.double() - ref.double()).abs()
    if mask is not None:
        diff = diff * mask[..., None].to(diff.device, diff.dtype)
    return diff.max().item()


# ---------------------------------------------------------------------- buckets
def test_buckets_round_up_within_limits():
    assert [bucket_length(n, 512) for n in (1, 16, 17, 128, 129, 500, 512)] == [
        16,
        16,
        32,
        128,
        192,
        512,
        512,
    ]
    assert bucket_length(100, 100) == 100  # never past max_position_embeddings
    assert [bucket_batch(n) for n in (1, 2, 3, 5, 32, 33)] == [1, 2, 4, 8, 32, 64]


# ---------------------------------------------------------------------- the guard is real
def test_guard_catches_the_eager_mask_path(host_read_guard):
    """The eager forward reads the mask back (padding or not); under the guard without
    capturing() that read must fail, or the guard would prove nothing below."""
    model = _model()
    ids, mask, types = _batch(3, 20, seed=1)
    _GUARD[0] = True
    try:
        with pytest.raises(HostRead), torch.inference_mode():
            model(ids, mask, types)
    finally:
        _GUARD[0] = False


# ---------------------------------------------------------------------- results
@pytest.mark.parametrize("min_uses", [1, 2])
def test_graphed_equals_eager_on_ragged_batches(host_read_guard, min_uses):
    model = _model()
    exact = copy.deepcopy(model).double()
    graphed = GraphedBert(model, min_uses=min_uses, capture=eager_capture)
    shapes = [(3, 20), (3, 20), (4, 9), (1, 128), (2, 30), (5, 17)] * 2
    with torch.inference_mode():
        for seed, (b, length) in enumerate(shapes):
            ids, mask, types = _batch(b, length, seed)
            got = graphed(ids, mask, types)
            ref = model(ids, mask, types).last_hidden_state
            want = exact(ids, mask, types).last_hidden_state
            assert got.shape == (b, length, TINY["hidden_size"])
            assert got.dtype == torch.float32
            baseline = _err(ref, want, mask)
            assert 0 < baseline < 1e-4
            assert _err(got, want, mask) <= 2 * baseline, (b, length, graphed.last_run)
    # buckets (4, 32), (4, 16), (1, 128), (2, 32), (8, 32); with min_uses=2 the first pass
    # replays only the repeated (3, 20)
    assert graphed.counts["captures"] == 5
    assert graphed.counts["replays"] == (12 if min_uses == 1 else 7)


def test_bookkeeping_min_uses_max_graphs_and_reasons(host_read_guard):
    model = _model()
    graphed = GraphedBert(model, min_uses=2, max_graphs=1, capture=eager_capture)
    ids, mask, types = _batch(3, 20, seed=0)
    with torch.inference_mode():
        graphed(ids, mask, types)
        assert graphed.last_run == "eager: first use of bucket (4, 32) (captured on use 2)"
        graphed(ids, mask, types)
        assert graphed.last_run == "graph (4, 32)"
        graphed(*_batch(4, 31, seed=1))  # same bucket: replayed, not captured again
        assert graphed.last_run == "graph (4, 32)"
        assert graphed.counts == {"captures": 1, "replays": 2, "eager": 1}
        other = _batch(2, 40, seed=2)
        graphed(*other)
        graphed(*other)
        assert graphed.last_run == "eager: 1 graphs captured already (max_graphs)"


def test_result_is_not_a_view_of_the_static_output(host_read_guard):
    model = _model()
    graphed = GraphedBert(model, min_uses=1, capture=eager_capture)
    with torch.inference_mode():
        first = graphed(*_batch(2, 12, seed=0))
        kept = first.clone()
        graphed(*_batch(2, 12, seed=5))
    assert torch.equal(first, kept)


def test_defaults_mask_and_types_like_the_model(host_read_guard):
    model = _model()
    graphed = GraphedBert(model, min_uses=1, capture=eager_capture)
    ids, _, _ = _batch(2, 10, seed=3)
    with torch.inference_mode():
        got = graphed(ids)
        ref = model(ids).last_hidden_state
    assert _err(got, ref) < 1e-5  # no mask: every position is real


def test_replaced_parameters_drop_the_graphs(host_read_guard):
    model = _model()
    graphed = GraphedBert(model, min_uses=1, capture=eager_capture)
    batch = _batch(2, 12, seed=0)
    with torch.inference_mode():
        graphed(*batch)
    model.double()  # new storages: the captured graphs would read the old ones
    with torch.inference_mode():
        got = graphed(*batch)
        ref = model(*batch).last_hidden_state
    assert graphed.counts["captures"] == 2
    assert got.dtype == torch.float64 and _err(got, ref, batch[1]) < 1e-12


@pytest.mark.parametrize(
    "setup, reason",
    [
        (lambda m: m.train(), "training mode"),
        (lambda m: None, "autograd is recording"),
    ],
)
def test_calls_that_cannot_be_graphed_run_eagerly(host_read_guard, setup, reason):
    model = _model()
    setup(model)
    graphed = GraphedBert(model, min_uses=1, capture=eager_capture)
    ids, mask, types = _batch(2, 12, seed=0)
    out = graphed(ids, mask, types)  # not under inference_mode
    assert graphed.last_run.startswith("eager:") and reason in graphed.last_run
    assert out.shape == (2, 12, TINY["hidden_size"])


def test_varlen_backend_runs_eagerly(host_read_guard):
    model = _model(backend="varlen")
    graphed = GraphedBert(model, min_uses=1, capture=eager_capture)
    with torch.inference_mode():
        graphed(*_batch(2, 12, seed=0))
    assert "packs by the mask's values" in graphed.last_run
    assert graphed.counts["captures"] == 0


def test_cpu_without_a_capture_function_says_why():
    model = _model()
    graphed = GraphedBert(model)
    with torch.inference_mode():
        graphed(*_batch(2, 12, seed=0))
        graphed(*_batch(2, 12, seed=0))
    assert graphed.last_run == "eager: CUDA graphs need a CUDA device, the model is on cpu"


def test_varlen_refuses_capture_with_a_clear_error():
    model = _model(backend="varlen")
    with capturing(), torch.inference_mode(), pytest.raises(ValueError, match="captured"):
        model(*_batch(2, 12, seed=0))


def test_capture_flag_nests_and_costs_nothing_on_cpu():
    assert not is_capturing(torch.device("cpu"))
    with capturing():
        with capturing():
            assert is_capturing(None)
        assert is_capturing(torch.device("cpu"))
    assert not is_capturing(None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_uses": 0}, "min_uses"),
        ({"max_graphs": -1}, "max_graphs"),
        ({"min_uses": True}, "min_uses"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GraphedBert(_model(), **kwargs)
    with pytest.raises(ValueError, match="BertModel"):
        GraphedBert(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_bad_shapes():
    graphed = GraphedBert(_model(), min_uses=1, capture=eager_capture)
    with pytest.raises(ValueError, match=r"\(batch, seq_len\)"):
        graphed(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        graphed(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 6))


# ---------------------------------------------------------------------- CUDA
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device for a real graph capture; the bucketing and the branch-free "
    "capture path are tested above on the CPU with an eager stand-in",
)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_graph_equals_eager(dtype):
    model = _model().cuda().to(dtype)
    exact = _model().double()
    graphed = GraphedBert(model, min_uses=1)
    with torch.inference_mode():
        for seed, (b, length) in enumerate([(3, 20), (4, 9), (2, 100), (3, 20)]):
            ids, mask, types = (t.cuda() for t in _batch(b, length, seed))
            got = graphed(ids, mask, types)
            assert graphed.last_run.startswith("graph"), graphed.last_run
            ref = model(ids, mask, types).last_hidden_state
            want = exact(ids.cpu(), mask.cpu(), types.cpu()).last_hidden_state
            baseline = _err(ref.cpu(), want, mask)
            assert _err(got.cpu(), want, mask) <= 2 * baseline + 1e-6


@needs_cuda
def test_cuda_graph_sees_in_place_weight_updates():
    model = _model().cuda()
    graphed = GraphedBert(model, min_uses=1)
    batch = tuple(t.cuda() for t in _batch(2, 12, seed=0))
    with torch.inference_mode():
        before = graphed(*batch)
    with torch.no_grad():  # in place: the captured graph reads the same storage
        model.encoder.layers[0].mlp.fc_out.weight.mul_(2.0)
    with torch.inference_mode():
        after = graphed(*batch)
        ref = model(*batch).last_hidden_state
    assert graphed.counts["captures"] == 1
    assert not torch.allclose(before, after)
    assert _err(after, ref, batch[1]) < 1e-4


@needs_cuda
def test_encode_on_cuda_replays_graphs(tiny_checkpoint):
    from bertattn.encoder import Bert

    bert = Bert.load(tiny_checkpoint, device="cuda")
    texts = [f"the attention head looks at token {i}" for i in range(40)]
    eager = Bert.load(tiny_checkpoint, device="cuda")
    eager.cuda_graphs = False
    got = bert.encode(texts, batch_size=8)
    want = eager.encode(texts, batch_size=8)
    assert bert.graph_runner is not None and bert.graph_runner.counts["replays"] > 0
    assert float(abs(got - want).max()) < 1e-4


# ---------------------------------------------------------------------- Bert.encode
def test_encode_through_an_assigned_runner_equals_plain_encode(host_read_guard, tiny_checkpoint):
    from bertattn.encoder import Bert

    texts = [f"the attention head looks at token {i} " * (i % 7 + 1) for i in range(30)]
    plain = Bert.load(tiny_checkpoint)
    want = plain.encode(texts, batch_size=8)
    graphed = Bert.load(tiny_checkpoint)
    graphed.graph_runner = GraphedBert(graphed.model, min_uses=1, capture=eager_capture)
    got = graphed.encode(texts, batch_size=8)
    assert graphed.graph_runner.counts["replays"] == 4  # 30 texts in batches of 8
    assert float(abs(got - want).max()) < 1e-5
    graphed.cuda_graphs = False  # switched off: the runner is not used
    graphed.encode(texts[:3])
    assert graphed.graph_runner.counts["replays"] == 4


@pytest.mark.parametrize("flag, expected", [(None, True), (False, False)])
def test_encode_job_passes_the_choice_on(tiny_checkpoint, flag, expected):
    from bertattn.jobs.encode import _load
    from bertattn.jobs.encode_options import EncodeOptions

    options = EncodeOptions(
        input="in.txt", output="o.npy", model=str(tiny_checkpoint), cuda_graphs=flag
    )
    assert _load(options).cuda_graphs is expected
