"""Encode benchmark: sentences/s on the real all-MiniLM-L6-v2 and a real corpus, tokenization
included, every peer on the same 1,000 texts, interleaved, medians of >= 5 rounds.

Peers: bertattn ``Bert.encode`` (fp32, bf16; its own default batching) vs transformers
``BertModel`` sdpa with length-sorted batches of 32 (fp32, bf16 autocast) vs
``SentenceTransformer.encode`` (its defaults). Accuracy: max abs difference and min cosine of
each against transformers fp32.
"""

from __future__ import annotations

import numpy as np
import torch

from bertattn import Bert
from bertattn.bench import interleaved_medians
from bertattn.bert.pipeline import default_model_dir

from .corpus import stdlib_docstring_corpus


def _hf_encoder(folder: str, autocast: bool):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, attn_implementation="sdpa").eval()

    def encode(texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            for s in range(0, len(order), 32):
                idx = order[s : s + 32]
                batch = tok(
                    [texts[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                )
                hidden = model(**batch).last_hidden_state.float()
                m = batch["attention_mask"].unsqueeze(-1).float()
                emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(emb, dim=1).numpy()
        return out

    return encode


def run_encode_bench(n: int = 1000, repeats: int = 5) -> dict[str, object]:
    texts = stdlib_docstring_corpus(n)
    folder = str(default_model_dir())
    fp32 = Bert.load()
    bf16 = Bert.load(dtype=torch.bfloat16)
    hf_fp32 = _hf_encoder(folder, autocast=False)
    hf_bf16 = _hf_encoder(folder, autocast=True)
    peers = {
        "bertattn fp32": lambda: fp32.encode(texts),
        "bertattn bf16": lambda: bf16.encode(texts),
        "transformers sdpa fp32": lambda: hf_fp32(texts),
        "transformers sdpa bf16-autocast": lambda: hf_bf16(texts),
    }
    try:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(folder, device="cpu")
        peers["sentence-transformers"] = lambda: st.encode(texts)
    except ImportError:
        pass
    outputs = {name: np.asarray(fn()) for name, fn in peers.items()}
    timer = interleaved_medians(peers, repeats=repeats, warmup=0)
    ref = outputs["transformers sdpa fp32"]
    base = timer.median("transformers sdpa fp32")
    rows = {}
    for name, emb in outputs.items():
        cos = (emb * ref).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1))
        sec = timer.median(name)
        rows[name] = {
            "seconds": sec,
            "sentences_per_s": len(texts) / sec,
            "speedup_vs_transformers_fp32": base / sec,
            "max_abs_diff": float(np.abs(emb - ref).max()),
            "min_cosine": float(cos.min()),
        }
    tokens = sum(len(e.ids) for e in fp32.tokenizer.encode_batch(texts, max_length=256))
    return {"texts": len(texts), "tokens": tokens, "peers": rows}


def format_encode_table(result: dict[str, object]) -> str:
    lines = [
        f"{result['texts']} texts, {result['tokens']} tokens (Python stdlib docstrings), "
        "all-MiniLM-L6-v2, tokenization included",
        f"{'peer':<34}{'sent/s':>8}{'vs HF fp32':>12}{'max|diff|':>11}{'min cos':>10}",
    ]
    for name, r in result["peers"].items():  # type: ignore[attr-defined]
        lines.append(
            f"{name:<34}{r['sentences_per_s']:>8.0f}{r['speedup_vs_transformers_fp32']:>11.2f}x"
            f"{r['max_abs_diff']:>11.1e}{r['min_cosine']:>10.6f}"
        )
    return "\n".join(lines)
