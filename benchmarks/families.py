"""Encode speed on BERT's family at base size: bertattn ``Bert.encode`` against transformers
``AutoModel`` (sdpa, or eager for MPNet, which has no other; length-sorted batches of 32) and
OpenVINO f32 (the ONNX export of the same folder; optional: ``pip install -r
requirements-bench.txt``), fp32, on short texts and on
paragraphs, every peer in the same run, interleaved, medians.

    python -m benchmarks.families [--family roberta,xlm-roberta,distilbert,electra,mpnet]
                                  [--short 256] [--long 64] [--repeats 3]

No base-size checkpoint of these families is installable here, so each is random weights
(seeded) at its base size (768 wide, 12 layers; DistilBERT 6), saved by transformers, with a
tokenizer trained for the run (byte-level BPE for RoBERTa, SentencePiece Unigram for
XLM-RoBERTa, BERT's WordPiece for DistilBERT, ELECTRA and MPNet): the work per token is the real
model's. Accuracy: the max cosine distance of each peer's mean-pooled rows to transformers'.
Targets: bertattn >= 1.3x transformers sdpa and >= 1.2x OpenVINO f32 per family and text kind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bertattn import Bert
from bertattn.bench import environment, interleaved_medians
from bertattn.encoder.pipeline import default_model_dir

from .corpus import stdlib_docstring_corpus, stdlib_paragraph_corpus
from .openvino_peer import openvino_encoders

FAMILIES = ("roberta", "xlm-roberta", "distilbert", "electra", "mpnet")
BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}
TARGETS = {"transformers sdpa": 1.3, "openvino f32": 1.2}
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
OURS = {"pooling": "mean", "normalize": True, "max_length": 256}  # as the peers do


def _tokenizer(family: str, folder: Path, corpus: list[str]) -> int:
    """A tokenizer for ``family`` in ``folder``; its vocabulary size."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer, processors

    if family in ("distilbert", "electra", "mpnet"):  # BERT's own WordPiece vocabulary
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(default_model_dir() / name, folder / name)
        return 30522
    if family == "roberta":
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(corpus, vocab_size=8000, special_tokens=SPECIALS)
    else:
        tok = SentencePieceUnigramTokenizer()
        tok.train_from_iterator(corpus, vocab_size=8000, special_tokens=SPECIALS, unk_token="<unk>")
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.save(str(folder / "tokenizer.json"))
    cls = "RobertaTokenizer" if family == "roberta" else "XLMRobertaTokenizer"
    specials = dict(
        zip(
            ("bos_token", "pad_token", "eos_token", "unk_token", "mask_token"),
            SPECIALS,
            strict=True,
        )
    )
    config = {
        "tokenizer_class": cls,
        "model_max_length": 512,
        "sep_token": "</s>",
        "cls_token": "<s>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, **specials}))
    return tok.get_vocab_size()


def save_base(family: str, folder: Path, corpus: list[str]) -> Path:
    """A seeded random base-size ``family`` model with its tokenizer, saved by transformers."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _tokenizer(family, folder, corpus)
    if family == "distilbert":
        sizes = {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072}
    elif family == "electra":
        sizes = {**BASE, "embedding_size": 768, "intermediate_size": 3072}
    elif family == "mpnet":  # all-mpnet-base-v2's shape
        sizes = {**BASE, "intermediate_size": 3072, "max_position_embeddings": 514}
    else:
        sizes = {**BASE, "intermediate_size": 3072, "pad_token_id": 1, "type_vocab_size": 1}
        sizes["max_position_embeddings"] = 514
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(family, vocab_size=vocab, **sizes)
    transformers.AutoModel.from_config(config).eval().save_pretrained(folder)
    return folder


def _hf(folder: Path) -> Callable[[list[str]], np.ndarray]:
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    try:
        model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    except ValueError:  # MPNet: transformers has only its eager attention
        model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()

    def encode(texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), model.config.hidden_size), np.float32)
        with torch.inference_mode():
            for s in range(0, len(order), 32):
                idx = order[s : s + 32]
                batch = tok([texts[i] for i in idx], padding=True, truncation=True,
                            max_length=256, return_tensors="pt")  # fmt: skip
                batch.pop("token_type_ids", None)
                hidden = model(**batch).last_hidden_state
                m = batch["attention_mask"][..., None].float()
                emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(emb, dim=1).numpy()
        return out

    return encode


def run(families: list[str], n_short: int, n_long: int, repeats: int) -> list[dict]:
    corpus = stdlib_docstring_corpus(2000)
    kinds = {
        "short": [" ".join(t.split()[:12]) for t in corpus[:n_short]],
        # whole docstrings of 800-3000 characters: the encoders cut them at 256 tokens
        "paragraphs": stdlib_paragraph_corpus(n_long),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            folder = save_base(family, Path(tmp) / family, corpus)
            bert = Bert.load(folder)
            hf = _hf(folder)
            ov, _, missing = openvino_encoders(folder, bert.tokenizer, ("f32",))
            for kind, texts in kinds.items():
                peers = {
                    "bertattn": lambda t=texts, b=bert: b.encode(t, **OURS),
                    "transformers sdpa": lambda t=texts, h=hf: h(t),
                }
                for name, fn in ov.items():
                    peers[name] = lambda fn=fn, t=texts: fn(t)
                outs = {name: np.asarray(fn()) for name, fn in peers.items()}
                timer = interleaved_medians(peers, repeats=repeats, warmup=0)
                ref = outs["transformers sdpa"]
                row = {"family": family, "kind": kind, "texts": len(texts), "missing": missing}
                for name, emb in outs.items():
                    cos = (emb * ref).sum(1) / (
                        np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1)
                    )
                    row[name] = {"seconds": timer.median(name), "cos_dist": float(1 - cos.min())}
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    ours = row["bertattn"]["seconds"]
    parts = [f"| {row['family']} | {row['kind']} ({row['texts']}) | {row['texts'] / ours:.1f}"]
    for peer, need in TARGETS.items():
        if peer in row:
            ratio = row[peer]["seconds"] / ours
            verdict = "met" if ratio >= need else "not met"
            parts.append(f"{row['texts'] / row[peer]['seconds']:.1f} | {ratio:.2f}x ({verdict})")
        else:
            parts.append("- | not measured")
    parts.append(f"{row['bertattn']['cos_dist']:.1e} |")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default=",".join(FAMILIES))
    ap.add_argument("--short", type=int, default=256)
    ap.add_argument("--long", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    env = environment()
    print(
        f"# {env['processor']}, {env['cpu_capability']}, {env['cpus']} cores, "
        f"{env['threads']} threads, torch {torch.__version__}, fp32"
    )
    print(
        "| family | texts | bertattn texts/s | sdpa texts/s | vs sdpa | OpenVINO f32 texts/s "
        "| vs OpenVINO | bertattn cos. dist. |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = run(args.family.split(","), args.short, args.long, args.repeats)
    for missing in {r["missing"] for r in rows if r["missing"]}:
        print(missing)


if __name__ == "__main__":
    main()
