"""Loading a checkpoint imports no compiler: the model is built on the ``meta`` device, where
an op with a Python meta kernel (``normal_``, ``cat``) imports ``torch._dynamo`` at its first
call, about 1.3 s of every command-line process's start (torch 2.13). bertattn builds its
embedding tables, its fused q/k/v storage and its rotary check there without such ops
(``blocks/tables.py``, ``attention/module.py``). Each folder is loaded in turn in one process,
BERT's first, so the first ``True`` names the family that brought the compiler in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_family_modernbert import save_modernbert
from test_family_mpnet import TINY as MPNET_TINY
from test_family_mpnet import save_mpnet

from bertattn.attention.module import _cat
from bertattn.blocks.tables import embedding

SRC = Path(__file__).resolve().parents[1] / "src"

PROBE = """
import json, sys
from bertattn import BertModel
seen = {}
for path in [None, *sys.argv[1:]]:
    BertModel.from_pretrained(path)
    seen[path or "default"] = "torch._dynamo" in sys.modules
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_loading_a_checkpoint_imports_no_compiler(tmp_path, tiny_checkpoint):
    save_modernbert(tmp_path / "modernbert", tiny_checkpoint)  # rotary, gated, pre-norm
    folders = [save_mpnet(tmp_path / "mpnet", MPNET_TINY), tmp_path / "modernbert"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, folders)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen == {"default": False, **{str(f): False for f in folders}}, seen


def test_embedding_tables_on_meta_are_left_uninitialized_and_elsewhere_initialized():
    with torch.device("meta"):
        meta = embedding(30, 8, padding_idx=0)
    assert meta.weight.device.type == "meta" and meta.weight.shape == (30, 8)
    assert meta.padding_idx == 0
    torch.manual_seed(0)
    real = embedding(30, 8, padding_idx=0)
    torch.manual_seed(0)
    plain = torch.nn.Embedding(30, 8, padding_idx=0)
    assert torch.equal(real.weight, plain.weight) and real.weight.abs().sum() > 0
    assert torch.equal(real.weight[0], torch.zeros(8))


def test_cat_on_meta_has_cats_shape_and_elsewhere_is_cat():
    parts = [torch.randn(4, 3), torch.randn(4, 3), torch.randn(2, 3)]
    assert torch.equal(_cat(parts), torch.cat(parts))
    meta = _cat([p.to("meta") for p in parts])
    assert meta.device.type == "meta" and meta.shape == (10, 3) and meta.dtype == torch.float32
