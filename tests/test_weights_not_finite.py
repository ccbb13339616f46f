"""Weights holding NaN or infinite values gave NaN rows without a word: the load warns, naming
the tensors and how many of their values, and a finite checkpoint loads silently."""

from __future__ import annotations

import math
import shutil
import warnings

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from bertattn import Bert


def _damaged(tiny_checkpoint, folder, **values: float):  # type: ignore[no-untyped-def]
    shutil.copytree(tiny_checkpoint, folder)
    state = load_file(folder / "model.safetensors")
    for name, value in values.items():
        state[name.replace("__", ".")].view(-1)[:2] = value  # two values of the tensor
    save_file(state, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_tensor_with_values_that_are_not_finite_is_named_at_load(
    tiny_checkpoint, tmp_path, value
):
    folder = _damaged(tiny_checkpoint, tmp_path / "bad",
                      encoder__layer__1__output__dense__weight=value)  # fmt: skip
    with pytest.warns(UserWarning) as caught:
        bert = Bert.load(folder, threads=1)
    (message,) = [str(w.message) for w in caught if "NaN or infinite" in str(w.message)]
    assert message == (
        f"{folder / 'model.safetensors'}: NaN or infinite values in 1 of its 39 tensors: "
        f"encoder.layer.1.output.dense.weight (2 of 1184 values); every output computed "
        f"through them will be NaN. The file is damaged or the training diverged: download it "
        f"again or use another checkpoint."
    )
    assert np.isnan(bert.encode(["hello world"])).all()  # what the warning is about


def test_many_are_counted_and_a_few_named(tiny_checkpoint, tmp_path):
    names = {f"encoder__layer__{i}__{part}": math.nan for i in (0, 1)
             for part in ("output__dense__bias", "intermediate__dense__bias")}  # fmt: skip
    folder = _damaged(tiny_checkpoint, tmp_path / "bad", **names)
    shown = r": NaN or infinite values in 4 of its 39 tensors: .* and 1 more; every output"
    with pytest.warns(UserWarning, match=shown):
        Bert.load(folder, threads=1)


def test_a_finite_checkpoint_loads_without_a_word(tiny_checkpoint):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Bert.load(tiny_checkpoint, threads=1)
