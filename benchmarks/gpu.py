"""GPU check and timings, in one call of a few minutes on a CUDA machine (never needed by tests).

    PYTHONPATH=src python -m benchmarks.gpu [--json gpu.json]

1. correctness on CUDA: MultiHeadAttention math vs sdpa vs varlen (fp32, bf16, fp16; padding,
   an all-padding row) by the relative rule against an fp64 CPU reference; a tiny BertModel on
   every backend vs Hugging Face on the same GPU;
2. the padded-batch BERT-base case of ByteTransformer's paper (B=16, max length 512, mean
   length 0.6 x max): bertattn varlen / sdpa vs HF BertModel sdpa, fp16 and bf16;
   bertattn sdpa replayed from CUDA graphs (``GraphedBert``) too;
3. launch-bound batches (BERT-base fp16, B=1..32, L=16..128): HF sdpa vs bertattn eager vs
   bertattn replayed from CUDA graphs;
4. the module at L=512 and 2048 (bf16), achieved TFLOP/s vs torch.nn.MultiheadAttention;
5. the issue's GPU targets, each printed as met / not met.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile

import torch

import bertattn
from bertattn.bench import environment
from bertattn.bench.module import attention_flops
from bertattn.encoder.graphs import GraphedBert

DEV = torch.device("cuda")


def _time(fn, repeats: int = 20) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def check_module() -> list[dict[str, object]]:
    torch.manual_seed(0)
    e, h, b, length = 256, 4, 4, 77
    m64 = bertattn.MultiHeadAttention(e, h, 0.0).double().eval()
    x64 = torch.randn(b, length, e, dtype=torch.float64)
    kpm = torch.ones(b, length, dtype=torch.bool)
    kpm[1, 40:] = False
    kpm[2, :] = False  # all padding
    kpm[3, 5:] = False
    with torch.no_grad():
        ref = m64(x64, key_padding_mask=kpm)[0]
    real = kpm
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        m = copy.deepcopy(m64).to(DEV, dtype)
        x = x64.to(DEV, dtype)
        k = kpm.to(DEV)
        errs = {}
        with torch.no_grad():
            for backend in ("math", "sdpa", "varlen"):
                m.backend = backend
                out = m(x, key_padding_mask=k, need_weights=backend == "math")[0].double().cpu()
                assert torch.isfinite(out).all(), (backend, dtype)
                errs[backend] = (out[real] - ref[real]).abs().max().item()
        ok = all(errs[n] <= 2 * errs["math"] + 1e-6 for n in errs)
        rows.append({"dtype": str(dtype), "max_err_vs_fp64": errs, "relative_rule_ok": ok})
        print(f"module {dtype}: {errs} relative rule {'OK' if ok else 'FAILED'}", flush=True)
    return rows


def check_bert() -> list[dict[str, object]]:
    from transformers import BertConfig as HFConfig
    from transformers import BertModel as HFBertModel

    torch.manual_seed(0)
    cfg = HFConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
    )
    cfg._attn_implementation = "eager"
    hf = HFBertModel(cfg).eval()
    ids = torch.randint(0, 99, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        hf.save_pretrained(tmp)
        hf = hf.to(DEV)
        ref = hf(ids.to(DEV), attention_mask=mask.to(DEV)).last_hidden_state
        real = mask.bool().to(DEV)
        for backend in ("math", "sdpa", "varlen", "auto"):
            model = bertattn.BertModel.from_pretrained(tmp, backend=backend).to(DEV)
            out = model(ids.to(DEV), mask.to(DEV)).last_hidden_state
            err = (out[real] - ref[real]).abs().max().item()
            rows.append({"backend": backend, "max_abs_diff_vs_hf": err, "ok": err < 1e-4})
            print(f"BertModel {backend}: max|diff| vs HF on real tokens {err:.2e}", flush=True)
    return rows


def padded_bert() -> list[dict[str, object]]:
    from transformers import BertConfig as HFConfig
    from transformers import BertModel as HFBertModel

    gen = torch.Generator().manual_seed(0)
    b, max_len = 16, 512
    lengths = torch.randint(int(0.2 * max_len), max_len + 1, (b,), generator=gen)  # mean ~0.6
    ids = torch.randint(1000, 30000, (b, max_len), generator=gen).to(DEV)
    mask = (torch.arange(max_len)[None] < lengths[:, None]).long().to(DEV)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        HFBertModel(HFConfig()).save_pretrained(tmp)
        for dtype in (torch.float16, torch.bfloat16):
            hf = HFBertModel.from_pretrained(tmp, attn_implementation="sdpa", dtype=dtype)
            hf = hf.to(DEV).eval()
            ours = {
                be: bertattn.BertModel.from_pretrained(tmp, dtype=dtype, backend=be).to(DEV)
                for be in ("varlen", "sdpa")
            }
            graphed = GraphedBert(ours["sdpa"], min_uses=1)
            with torch.inference_mode():
                t_hf = _time(lambda m=hf: m(input_ids=ids, attention_mask=mask))
                times = {
                    f"bertattn {be}": _time(lambda m=m: m(ids, mask)) for be, m in ours.items()
                }
                times["bertattn sdpa graphed"] = _time(lambda g=graphed: g(ids, mask))
                ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
                real = mask.bool()
                diff = {
                    be: (m(ids, mask).last_hidden_state[real] - ref[real]).abs().max().item()
                    for be, m in ours.items()
                }
                diff["sdpa graphed"] = (graphed(ids, mask)[real] - ref[real]).abs().max().item()
            row = {
                "dtype": str(dtype),
                "mean_len": float(lengths.float().mean()),
                "hf_sdpa_ms": t_hf * 1e3,
                **{f"{k}_ms": v * 1e3 for k, v in times.items()},
                "speedup_vs_hf": {k: t_hf / v for k, v in times.items()},
                "max_abs_diff_vs_hf": diff,
            }
            rows.append(row)
            print(f"padded BERT-base {dtype}: {json.dumps(row)}", flush=True)
            torch.cuda.empty_cache()
    return rows


def small_batches() -> list[dict[str, object]]:
    """Launch-bound BERT-base fp16 batches: what replaying a CUDA graph saves."""
    from transformers import BertConfig as HFConfig
    from transformers import BertModel as HFBertModel

    gen = torch.Generator().manual_seed(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        HFBertModel(HFConfig()).save_pretrained(tmp)
        hf = HFBertModel.from_pretrained(tmp, attn_implementation="sdpa", dtype=torch.float16)
        hf = hf.to(DEV).eval()
        ours = bertattn.BertModel.from_pretrained(tmp, dtype=torch.float16).to(DEV)
        graphed = GraphedBert(ours, min_uses=1)
        for b, length in ((1, 16), (1, 128), (8, 64), (32, 128)):
            ids = torch.randint(1000, 30000, (b, length), generator=gen).to(DEV)
            mask = torch.ones(b, length, dtype=torch.long, device=DEV)
            mask[b // 2 :, length // 2 :] = 0  # half the rows padded to half length
            with torch.inference_mode():
                t_hf = _time(lambda i=ids, k=mask: hf(input_ids=i, attention_mask=k))
                t_eager = _time(lambda i=ids, k=mask: ours(i, k))
                t_graph = _time(lambda i=ids, k=mask: graphed(i, k))
            row = {
                "batch": b,
                "seq_len": length,
                "hf_sdpa_ms": t_hf * 1e3,
                "bertattn_eager_ms": t_eager * 1e3,
                "bertattn_graphed_ms": t_graph * 1e3,
                "graphed_speedup_vs_hf": t_hf / t_graph,
                "last_run": graphed.last_run,
            }
            rows.append(row)
            print(f"launch-bound BERT-base fp16: {json.dumps(row)}", flush=True)
    return rows


def targets(out: dict[str, object]) -> list[str]:
    """The issue's GPU targets, each met / not met / not measured, from this run's rows."""
    lines = []
    padded = out.get("padded_bert")
    fp16 = (
        [r for r in padded if r.get("dtype") == "torch.float16"] if isinstance(padded, list) else []
    )
    if fp16:
        best = max(fp16[0]["speedup_vs_hf"].items(), key=lambda kv: kv[1])
        verdict = "met" if best[1] >= 2.0 else "not met"
        lines.append(
            f"BERT-base B=16 max 512 mean 0.6x fp16 >= 2x HF sdpa: {verdict} "
            f"(best {best[0]}: {best[1]:.2f}x)"
        )
    else:
        lines.append("BERT-base B=16 fp16 >= 2x HF sdpa: not measured (padded_bert failed)")
    tflops = out.get("module_tflops")
    for b, length in ((8, 512), (1, 2048)):
        row = (
            next((r for r in tflops if r["batch"] == b and r["seq_len"] == length), None)
            if isinstance(tflops, list)
            else None
        )
        if row is None:
            lines.append(f"module bf16 B={b} L={length} >= 1.0x torch MHA: not measured")
            continue
        ratio = row["torch_mha_ms"] / row["bertattn_ms"]
        verdict = "met" if ratio >= 1.0 else "not met"
        lines.append(f"module bf16 B={b} L={length} >= 1.0x torch MHA: {verdict} ({ratio:.2f}x)")
    return lines


def padding_sweep() -> list[dict[str, object]]:
    """fp16 BERT-base, B=16: where does packing (varlen) start to beat the padded batch?"""
    from transformers import BertConfig as HFConfig
    from transformers import BertModel as HFBertModel

    gen = torch.Generator().manual_seed(1)
    cases = {
        "U[0.8L, L]": torch.randint(410, 513, (16,), generator=gen),
        "U[0.2L, L]": torch.randint(102, 513, (16,), generator=gen),
        "U[16, L]": torch.randint(16, 513, (16,), generator=gen),
        "one 512 + U[16, 128]": torch.cat(
            [torch.tensor([512]), torch.randint(16, 129, (15,), generator=gen)]
        ),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        HFBertModel(HFConfig()).save_pretrained(tmp)
        ours = {
            be: bertattn.BertModel.from_pretrained(tmp, dtype=torch.float16, backend=be).to(DEV)
            for be in ("varlen", "sdpa")
        }
        for name, lengths in cases.items():
            ids = torch.randint(1000, 30000, (16, 512), generator=gen).to(DEV)
            mask = (torch.arange(512)[None] < lengths[:, None]).long().to(DEV)
            pad = 1 - float(lengths.sum()) / (16 * 512)
            with torch.inference_mode():
                t = {be: _time(lambda m=m, i=ids, k=mask: m(i, k)) * 1e3 for be, m in ours.items()}
            row = {"lengths": name, "pad_fraction": pad, **{f"{k}_ms": v for k, v in t.items()}}
            rows.append(row)
            print(f"padding sweep fp16: {json.dumps(row)}", flush=True)
    return rows


def module_tflops() -> list[dict[str, object]]:
    rows = []
    for b, length in ((8, 512), (1, 2048), (8, 2048)):
        torch.manual_seed(0)
        ours = bertattn.MultiHeadAttention(768, 12, 0.0).to(DEV, torch.bfloat16).eval()
        t = torch.nn.MultiheadAttention(768, 12, batch_first=True).to(DEV, torch.bfloat16).eval()
        x = torch.randn(b, length, 768, device=DEV, dtype=torch.bfloat16)
        with torch.inference_mode():
            t_ours = _time(lambda m=ours, x=x: m(x, need_weights=False))
            t_mha = _time(lambda m=t, x=x: m(x, x, x, need_weights=False))
        flops = attention_flops(b, length, 768)
        row = {
            "batch": b,
            "seq_len": length,
            "bertattn_tflops": flops / t_ours / 1e12,
            "torch_mha_tflops": flops / t_mha / 1e12,
            "bertattn_ms": t_ours * 1e3,
            "torch_mha_ms": t_mha * 1e3,
        }
        rows.append(row)
        print(f"module bf16 B={b} L={length}: {json.dumps(row)}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="gpu.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    host = environment()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    print(f"host: {host}", flush=True)
    out: dict[str, object] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "host": host,
    }
    for name, fn in (
        ("module_check", check_module),
        ("bert_check", check_bert),
        ("padded_bert", padded_bert),
        ("small_batches", small_batches),
        ("module_tflops", module_tflops),
    ):
        try:
            out[name] = fn()
        except Exception as exc:  # report and go on: one call must bring back everything
            print(f"{name} FAILED: {type(exc).__name__}: {exc}", flush=True)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    out["targets"] = targets(out)
    for line in out["targets"]:
        print(f"target: {line}", flush=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
