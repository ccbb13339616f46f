"""float32 long texts: each lever between the products, measured on its own.

    python -m benchmarks.levers [--paragraphs 40] [--rounds 7] [--threads N]

On MiniLM (the default model), float32, ``torch.inference_mode()``:

- **the feed-forward block at 1,024 rows** (one row chunk of paragraphs), each variant against
  the plain ops in the same rounds (interleaved, per-round ratios, medians):
  ``gelu in place`` (the exact GELU written over the first product's output),
  ``residual folded`` (the second product accumulating onto ``x + bias``, ``addmm_``),
  ``both`` (what :meth:`bertattn.families.bert_layers.BertMLP.forward_residual` runs), and
  ``oneDNN bias+GELU`` (the first product with its bias and GELU inside oneDNN's kernel,
  :mod:`bertattn.attention.fused`, which runs where oneDNN computes the products);
- **the attention output's layout copy**: a packed batch's attention (``varlen``, one SDPA
  call per paragraph) against the same calls without writing their outputs into the packed
  ``(T, H, D)`` tensor: the share of the attention that copy is;
- **end to end**: ``Bert.encode`` of the paragraphs (256 tokens at most) with the fold on
  (the default) and off (``bertattn.families.bert_layers.FOLD_RESIDUAL = False``), interleaved, and
  OpenVINO f32 on the same ONNX export and texts when it is installed
  (``pip install -r requirements-bench.txt``; its threads set to this process's; then every
  peer on the wall clock, as OpenVINO computes on threads of its own).

Timing: wall clock at more than one thread; at one thread the thread's CPU time
(``time.thread_time``), which a process beside this one does not inflate.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from bertattn import Bert
from bertattn.attention import gemm
from bertattn.bench import environment
from bertattn.families import bert_layers as model_mod

from .corpus import stdlib_paragraph_corpus

#: the latest :func:`_ab`'s seconds per round, by name
_LAST: dict[str, list[float]] = {}


def _clock():  # type: ignore[no-untyped-def]
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def _ab(
    fns: dict, rounds: int, loops: int = 3, wall: bool = False
) -> dict[str, tuple[float, float]]:
    """``name -> (median seconds, median per-round ratio to the first entry)``; ``wall``: the
    wall clock whatever the thread count."""
    clock = time.perf_counter if wall else _clock()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for name in order:
            start = clock()
            for _ in range(loops):
                fns[name]()
            times[name].append((clock() - start) / loops)
    base = next(iter(fns))
    _LAST.clear()
    _LAST.update(times)
    return {
        k: (
            statistics.median(v),
            statistics.median(a / b for a, b in zip(v, times[base], strict=True)),
        )
        for k, v in times.items()
    }


def mlp_block(bert: Bert, rounds: int, rows: int = 1024) -> dict[str, tuple[float, float]]:
    layer = bert.model.encoder.layers[0]
    fc_in, fc_out = layer.mlp.fc_in, layer.mlp.fc_out
    wi, bi, wf, bf = fc_in.weight, fc_in.bias, fc_out.weight, fc_out.bias
    e = wi.shape[1]
    x = torch.randn(rows, e, generator=torch.Generator().manual_seed(0))
    op = gemm._onednn_op()

    def plain():  # type: ignore[no-untyped-def]
        return x + F.linear(F.gelu(F.linear(x, wi, bi)), wf, bf)

    def gelu_in_place():  # type: ignore[no-untyped-def]
        return x + F.linear(torch.ops.aten.gelu_(F.linear(x, wi, bi)), wf, bf)

    def folded():  # type: ignore[no-untyped-def]
        out = x + bf
        return out.addmm_(F.gelu(F.linear(x, wi, bi)), wf.t())

    def both():  # type: ignore[no-untyped-def]
        out = x + bf
        return out.addmm_(torch.ops.aten.gelu_(F.linear(x, wi, bi)), wf.t())

    fns = {"plain": plain, "gelu in place": gelu_in_place, "residual folded": folded, "both": both}
    if op is not None and torch.backends.mkldnn.is_available():
        fns["oneDNN bias+GELU"] = lambda: x + F.linear(op(x, wi, bi, "gelu", [], "none"), wf, bf)
    want = plain()
    for name, fn in fns.items():
        torch.testing.assert_close(fn(), want, atol=1e-4, rtol=1e-4, msg=name)
    return _ab(fns, rounds)


def attention_copy(bert: Bert, rounds: int, lengths: list[int]) -> dict[str, tuple[float, float]]:
    cfg = bert.model.config
    h, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    t = sum(lengths)
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(t, 3, h, d, generator=g)
    q, k, v = qkv.unbind(1)  # (T, H, D) views of the fused projection, as the model has them
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + n)

    def calls(write: bool) -> None:
        out = torch.empty_like(q) if write else None
        for s, e in zip(offs[:-1], offs[1:], strict=True):
            qs, ks, vs = (x[s:e].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qs, ks, vs)
            if out is not None:
                out[s:e] = o[0].transpose(0, 1)

    return _ab(
        {"sdpa + copy into (T, H, D)": lambda: calls(True), "sdpa alone": lambda: calls(False)},
        rounds,
    )


def encode(bert: Bert, texts: list[str], rounds: int) -> dict[str, tuple[float, float]]:
    from .openvino_peer import openvino_encoders

    def run(fold: bool):  # type: ignore[no-untyped-def]
        def go() -> None:
            model_mod.FOLD_RESIDUAL = fold
            try:
                bert.encode(texts, batch_size=32)
            finally:
                model_mod.FOLD_RESIDUAL = True

        return go

    fns = {"fold off (plain ops)": run(False), "fold on (default)": run(True)}
    peers, _, missing = openvino_encoders(
        bert.folder.model_dir, bert.tokenizer, precisions=("f32",)
    )
    if missing:
        print(missing)
    for name, fn in peers.items():
        fns[name] = lambda fn=fn: fn(texts)  # type: ignore[misc]
    return _ab(fns, rounds, loops=1, wall=bool(peers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.levers", description=__doc__)
    parser.add_argument("--paragraphs", type=int, default=40, help="paragraphs (default 40)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: policy)")
    args = parser.parse_args(argv)
    bert = Bert.load(threads=args.threads or None)
    texts = stdlib_paragraph_corpus(args.paragraphs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (truncation at 256 tokens is the point)
        lengths = [len(enc.ids) for enc in bert.tokenizer.encode_batch(texts, max_length=256)]
    env = environment()
    print(
        f"levers, float32, MiniLM; threads={torch.get_num_threads()}, {env['processor']}, "
        f"cpu_capability={env['cpu_capability']}, torch {env['torch']}"
    )
    with torch.inference_mode():
        packed = f"attention of {len(lengths)} packed paragraphs ({sum(lengths)} tokens)"
        parts = {
            "feed-forward block, 1,024 rows": mlp_block(bert, args.rounds * 2),
            packed: attention_copy(bert, args.rounds * 2, lengths),
        }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts[f"Bert.encode, {len(texts)} paragraphs"] = encode(bert, texts, args.rounds)
    for what, rows in parts.items():
        print(what)
        for name, (seconds, ratio) in rows.items():
            print(f"  {name:<30}{seconds * 1e3:10.2f} ms  {ratio:6.3f}x the first row's time")
    ov = _LAST.get("openvino f32")
    if ov:  # texts/s over OpenVINO's, round by round (the target: >= 1.2x)
        for name in ("fold off (plain ops)", "fold on (default)"):
            speed = statistics.median(o / b for o, b in zip(ov, _LAST[name], strict=True))
            print(f"  {name}: {speed:.2f}x OpenVINO f32's texts/s (target 1.2x)")
    print(gemm.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
