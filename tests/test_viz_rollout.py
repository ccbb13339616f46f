"""Attention rollout against a hand-computed example."""

from __future__ import annotations

import numpy as np
import pytest
from viz_data import softmax_maps

from bertattn.maps import AttentionMaps
from bertattn.viz import attention_rollout


def two_layer_example() -> AttentionMaps:
    # layer 0 has two heads whose mean is [[1/2, 1/2], [0, 1]]; layer 1 one head
    l0 = np.array([[[1, 0], [0, 1]], [[0, 1], [0, 1]]], dtype=np.float32)
    l1 = np.array([[[0, 1], [0.5, 0.5]]], dtype=np.float32)
    l1 = np.concatenate([l1, l1])  # same head twice: mean unchanged
    return AttentionMaps(["a", "b"], [l0, l1])


def test_rollout_matches_hand_computation():
    # by hand: Â0 = rownorm([[1/2,1/2],[0,1]] + I) = [[3/4,1/4],[0,1]]
    #          Â1 = rownorm([[0,1],[1/2,1/2]] + I) = [[1/2,1/2],[1/4,3/4]]
    #          R  = Â1 @ Â0 = [[3/8, 5/8], [3/16, 13/16]]
    r = attention_rollout(two_layer_example())
    assert r.shape == (2, 2) and r.dtype == np.float32
    np.testing.assert_allclose(r, [[3 / 8, 5 / 8], [3 / 16, 13 / 16]], rtol=0, atol=1e-7)


def test_rollout_without_residual_is_the_plain_product():
    # [[0,1],[1/2,1/2]] @ [[1/2,1/2],[0,1]] = [[0,1],[1/4,3/4]]
    r = attention_rollout(two_layer_example(), residual=False)
    np.testing.assert_allclose(r, [[0, 1], [1 / 4, 3 / 4]], rtol=0, atol=1e-7)


def test_rollout_max_reduction_by_hand():
    # max over heads of layer 0: [[1,1],[0,1]] -> +I, rownorm: [[2/3,1/3],[0,1]]
    # R = [[1/2,1/2],[1/4,3/4]] @ that = [[1/3, 2/3], [1/6, 5/6]]
    r = attention_rollout(two_layer_example(), head_reduce="max")
    np.testing.assert_allclose(r, [[1 / 3, 2 / 3], [1 / 6, 5 / 6]], rtol=0, atol=1e-6)


def test_rollout_rows_sum_to_one():
    maps = softmax_maps(17, 4, 3, seed=1)
    r = attention_rollout(maps)
    assert r.shape == (17, 17)
    np.testing.assert_allclose(r.sum(axis=-1), 1.0, atol=1e-5)
    assert (r >= 0).all()


def test_a_row_without_attention_keeps_its_identity():
    maps = softmax_maps(5, 2, 2, seed=2)
    maps.layers[0][:, 4, :] = 0.0  # e.g. a fully masked padding query
    r = attention_rollout(maps, residual=False)
    np.testing.assert_allclose(r.sum(axis=-1), 1.0, atol=1e-5)
    assert np.isfinite(r).all()


def test_unknown_head_reduce_names_the_valid_ones():
    with pytest.raises(ValueError, match="'median' is not one of mean, max, min"):
        attention_rollout(two_layer_example(), head_reduce="median")


def test_partial_layers_warn():
    maps = softmax_maps(4, 2, 2, layer_ids=[3, 5])
    with pytest.warns(UserWarning, match=r"layers \[3, 5\] only"):
        attention_rollout(maps)
