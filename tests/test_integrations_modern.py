"""``attn_implementation="bertattn"`` on the modern encoders in transformers: ModernBERT (its
local layers' window included, on inputs far longer than the window), GTE, NomicBERT and Jina
v3 (random weights, a fixed seed, tiny sizes) give the hidden states of transformers' own
``sdpa``, and bertattn's function ran (a dispatch is recorded)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertattn.integrations.transformers  # noqa: E402, F401  (registers "bertattn")
from bertattn.attention import dispatch  # noqa: E402

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
    intermediate_size=29, max_position_embeddings=300, pad_token_id=0,
)  # fmt: skip
MODELS = {
    "modernbert": ("ModernBertModel", "ModernBertConfig", {
        "local_attention": 6, "global_attn_every_n_layers": 2, "cls_token_id": 2,
        "sep_token_id": 3, "bos_token_id": 2, "eos_token_id": 3,
    }),
    "gte": ("GteModel", "GteConfig", {}),
    "nomic_bert": ("NomicBertModel", "NomicBertConfig", {}),
    "jina_embeddings_v3": ("JinaEmbeddingsV3Model", "JinaEmbeddingsV3Config", {}),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_bertattn_equals_sdpa_inside_transformers(kind: str, tmp_path) -> None:
    model_name, config_name, extra = MODELS[kind]
    config = getattr(transformers, config_name)(**{**SIZES, **extra})
    torch.manual_seed(0)
    getattr(transformers, model_name)(config).save_pretrained(tmp_path)
    cls = getattr(transformers, model_name)
    sdpa = cls.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    ours = cls.from_pretrained(tmp_path, attn_implementation="bertattn").eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 90), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 40:] = 0
    mask[2, 7:] = 0
    with torch.no_grad(), dispatch.explain() as ex:
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        want = sdpa(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)
    assert "transformers attn_implementation='bertattn'" in str(ex)
