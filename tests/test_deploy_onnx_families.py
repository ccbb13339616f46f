"""``export-onnx`` on BERT's family and the rotary encoders: RoBERTa, XLM-RoBERTa, DistilBERT,
ELECTRA, MPNet, ModernBERT (rotary positions and local windows in the graph) and GTE
checkpoints (random weights, tiny sizes, saved by transformers) export to ONNX and ONNX Runtime
gives the PyTorch encoder's hidden states on a padded batch; ``bertattn encode --onnx`` on the
RoBERTa folder writes the rows ``Bert.encode`` gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_deploy_onnx import _check_parity, _padded, _session
from test_family_distilbert import save_distilbert
from test_family_electra import save_electra
from test_family_modernbert import save_modernbert
from test_family_mpnet import TINY as MPNET_TINY
from test_family_mpnet import save_mpnet
from test_family_roberta import TEXTS, save_family

from bertattn import Bert, BertModel
from bertattn.deploy import export_onnx

pytestmark = pytest.mark.slow  # an export each: seconds on 2 cores


FAMILIES = ["roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "modernbert", "gte"]


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "modernbert":  # rotary tables and the window's band in the graph
        save_modernbert(out, tiny_checkpoint)
        return out
    if request.param == "gte":
        import transformers
        from tiny_bert import save_random

        config = transformers.GteConfig(
            vocab_size=99, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
            intermediate_size=29, max_position_embeddings=300, pad_token_id=0,
        )  # fmt: skip
        save_random(transformers.GteModel, config, out, 2, tiny_checkpoint)
        return out
    if request.param == "distilbert":
        return save_distilbert(tiny_checkpoint, out)
    if request.param == "electra":
        return save_electra(tiny_checkpoint, out)
    if request.param == "mpnet":  # its relative position bias is in the graph
        return save_mpnet(out, MPNET_TINY)
    return save_family(request.param, out)


def test_family_onnx_matches_pytorch(folder, tmp_path):
    model = BertModel.from_pretrained(folder, backend="math").eval()
    path = export_onnx(model, tmp_path / "model.onnx")
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    # MPNet: far buckets; ModernBERT: far past its window of +-3
    far = model.config.family in ("mpnet", "modernbert")
    lengths = (3, 170, 9, 1) if far else (3, 17, 9, 1)
    rows = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in lengths]
    ids, mask, types = _padded(rows, max(lengths), pad_id=model.config.pad_token_id or 0)
    if model.pooler is not None:  # RoBERTa's: hidden states and pooler
        _check_parity(model, _session(path), (ids, mask, types))
        return
    with torch.inference_mode():  # DistilBERT has no pooler: the hidden states alone
        want = model(ids, mask, types).last_hidden_state.numpy()
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    session = _session(path)
    feed["token_type_ids"] = types.numpy()
    feed = {k: v for k, v in feed.items() if k in {i.name for i in session.get_inputs()}}
    (got,) = session.run(["last_hidden_state"], feed)
    real = mask.numpy().astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_encode_onnx_equals_pytorch_on_roberta(tiny_checkpoint, tmp_path, cli):
    """In process (``cli``): the rows are the claim, not the process."""
    folder = save_family("roberta", tmp_path / "roberta")
    bert = Bert.load(folder, threads=1, backend="math")
    onnx = export_onnx(bert.model, tmp_path / "roberta.onnx")
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    r = cli("encode", tmp_path / "in.txt", "-o", out, "--onnx", onnx, "--model", folder)
    assert r.code == 0, r.err
    got = np.load(out)
    want = bert.encode(TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
