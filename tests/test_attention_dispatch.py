"""Which backend ran and why: explain(), module.last_dispatch, the bertattn.dispatch logger."""

from __future__ import annotations

import logging

import pytest
import torch

import bertattn

E, H = 16, 4
X = torch.randn(2, 5, E)


def test_auto_picks_math_for_weights_and_sdpa_otherwise() -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    assert m.last_dispatch is None
    with bertattn.explain() as log:
        _, w = m(X)
        _, w_none = m(X, need_weights=False)
    assert w is not None and w_none is None
    assert log.backends() == ["math", "sdpa"]
    first, second = log.records
    assert isinstance(first, bertattn.Dispatch)
    assert first.requested == second.requested == "auto"
    assert "need_weights=True" in first.reason and "only math returns them" in first.reason
    assert "no weights needed" in second.reason
    assert first.shape == (2, H, 5, E // H) and first.dtype == "float32"
    assert m.last_dispatch == second
    assert str(log).splitlines()[0].startswith("math")
    assert "sdpa" in str(log).splitlines()[1]


@pytest.mark.parametrize("backend", list(bertattn.BACKENDS))
def test_explicit_backend_is_recorded(backend: str) -> None:
    m = bertattn.MultiHeadAttention(E, H, backend=backend).eval()
    with bertattn.explain() as log:
        m(X, need_weights=False)
    assert log.backends() == [backend]
    assert log.records[0].reason == "asked for explicitly"
    assert m.last_dispatch.backend == backend


def test_nothing_recorded_outside_the_block_and_blocks_nest() -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    with bertattn.explain() as outer:
        m(X)
        with bertattn.explain() as inner:
            m(X, need_weights=False)
        m(X)
    m(X)
    assert outer.backends() == ["math", "math"]
    assert inner.backends() == ["sdpa"]
    assert str(bertattn.DispatchLog()) == "(no attention call recorded)"


def test_debug_logger(caplog: pytest.LogCaptureFixture) -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    with caplog.at_level(logging.INFO, logger="bertattn.dispatch"):
        m(X)
    assert not caplog.records  # only at DEBUG
    with caplog.at_level(logging.DEBUG, logger="bertattn.dispatch"):
        m(X, need_weights=False)
    recs = [r for r in caplog.records if r.name == "bertattn.dispatch"]
    assert len(recs) == 1 and recs[0].levelno == logging.DEBUG
    assert recs[0].getMessage().startswith("sdpa") and "asked auto" in recs[0].getMessage()
