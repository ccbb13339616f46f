"""torchao's dynamic int8 against bertattn's own int8, on the whole default model (MiniLM).

    python -m benchmarks.int8_torchao --threads 1 [--rounds 3] [--short 64] [--paragraphs 8]
        [--compile] [--transformers]

The peers, in one process and timed in alternating rounds (CPU seconds, meaningful with one
thread):

* ``float32``: ``Bert.load()``, the reference of every fidelity number;
* ``int8``: ``Bert.load(dtype="int8")``, bertattn's hand-written int8 (its refusal, where this
  CPU has no fast exact form, is printed and the rest still runs);
* ``torchao``: the float32 model with every product of its encoder layers (the fused q/k/v
  projection, the attention output, both feed-forward linears) an ``nn.Linear`` quantized by
  torchao's ``quantize_(linear, Int8DynamicActivationInt8WeightConfig())`` (int8 weights per
  channel, int8 activations per token, symmetric), run through the seam bertattn's block
  families use for int8 (:mod:`bertattn.encoder.int8_blocks`); everything between the
  products stays float32, as in bertattn's int8;
* ``torchao compiled`` (``--compile``): that model's forward through ``torch.compile``
  (inductor, dynamic shapes, frozen weights), timed on the timed texts only.

Fidelity is bertattn's own check (:func:`bertattn.encoder.int8.compare`: min / mean cosine of
the sentence embeddings against float32, the share of each text's 10 nearest neighbours kept)
on the holdout ``benchmarks.int8`` uses (500 short texts, 100 paragraphs cut at 256 tokens).
``--transformers``: the same check for transformers' ``BertModel`` quantized by torchao against
its own float32. The header names the product torchao's x86 path calls on this CPU, its speed
against float32's product and whether it is exact (a kernel whose byte pairs saturate is not).
Without torchao (``pip install torchao``) it says so and measures the rest.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from bertattn import Bert
from bertattn.bench import auto_line, environment
from bertattn.encoder import int8, int8_blocks, int8_speed
from bertattn.encoder.compiled import CompiledForward, _check
from bertattn.encoder.folder import default_model_dir

from .corpus import stdlib_paragraph_corpus
from .int8 import print_cpu_time, print_fidelity, print_refusal, short_texts
from .modern import transformers_encoder

#: what torchao offers, or None where it is not installed: (quantize_, the config class)
Torchao = tuple[Callable[..., None], type] | None


def load_torchao() -> Torchao:
    """torchao's ``quantize_`` and ``Int8DynamicActivationInt8WeightConfig``, or None (printed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        print("torchao: not installed (pip install torchao), not measured")
        return None
    return quantize_, Int8DynamicActivationInt8WeightConfig


def kernel_line() -> str:
    """Which int8 product torchao's CPU path calls here (it takes u8 x s8 on VNNI CPUs without
    AMX, else ``torch._int_mm`` on s8 x s8), timed against float32's product on
    :data:`~bertattn.encoder.int8_speed.SPEED_SHAPE` (CPU seconds), and its largest error
    against the exact integer product on full-range bytes (0: no saturation)."""
    from torchao.kernel import intmm

    u8 = intmm._cpu_is_vnni_supported() and not intmm._cpu_is_amx_tile_supported()
    rows, k, n = int8_speed.SPEED_SHAPE
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (rows, k), dtype=torch.int8, generator=gen)  # (M, K)
    b = torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=gen)  # (K, N)
    exact = a.long() @ b.long()  # (M, N)
    got = intmm._int_scaled_matmul_cpu(a, b, torch.ones(rows, 1))  # (M, N), float32
    error = float((got.double() - exact.double()).abs().max() / exact.abs().max())
    x, w, ones = a.float(), b.float(), torch.ones(rows, 1)
    calls = {"int8": lambda: intmm._int_scaled_matmul_cpu(a, b, ones), "float32": lambda: x @ w}
    spent = dict.fromkeys(calls, 0.0)
    for fn in calls.values():
        fn()  # warm
    for _ in range(3):
        for name, fn in calls.items():
            start = time.process_time()
            fn()
            spent[name] += time.process_time() - start
    form = "u8 x s8 (VNNI, no AMX)" if u8 else "s8 x s8 (no VNNI, or AMX)"
    return (
        f"torchao's x86 int8 product here: torch._int_mm, {form}; a {rows}x{k} -> {n} product "
        f"{spent['int8'] / 3 * 1e3:.3g} ms against float32 {spent['float32'] / 3 * 1e3:.3g} ms "
        f"({spent['float32'] / spent['int8']:.3g}x, CPU time), largest error against the exact "
        f"integer product {error:.2g} of its largest value"
    )


def torchao_product(tao: Torchao) -> int8_blocks.MakeInt8:
    """A maker of one product for :meth:`bertattn.encoder.int8_blocks.Product.quantize`: an
    ``nn.Linear`` ``(K) -> (N)`` with a copy of the float32 weight ``(N, K)`` and bias ``(N,)``,
    quantized by torchao (SmoothQuant's factors are not used: torchao's config has none)."""
    assert tao is not None
    quantize_, config = tao

    def make(weight: Tensor, bias: Tensor | None, smooth: Tensor | None) -> nn.Module:
        lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        with torch.no_grad():
            lin.weight.copy_(weight)
            if bias is not None:
                lin.bias.copy_(bias)
        quantize_(lin.eval(), config())
        return lin

    return make


def torchao_bert(tao: Torchao, threads: int) -> Bert:
    """The default model in float32 with each product of its encoder layers run by torchao."""
    bert = Bert.load(threads=threads)
    make = torchao_product(tao)
    for layer in bert.model.encoder.layers:
        for product in int8_blocks.install(layer):
            product.quantize(make, 0.0)
    return bert


def compile_torchao(bert: Bert) -> Callable[[list[str]], object] | None:
    """``bert``'s forward through ``torch.compile`` (bertattn's compiled forward: inductor,
    dynamic shapes, frozen weights), its build time and error against eager printed; None
    (printed) where it fails."""
    start = time.perf_counter()
    compiled = CompiledForward(bert.model)
    try:
        error = _check(bert.model, compiled, bert)
    except Exception as exc:  # a benchmark reports what failed and goes on
        print(f"torchao compiled: failed ({type(exc).__name__}: {str(exc)[:300]})")
        return None
    print(
        f"torchao compiled in {time.perf_counter() - start:.0f} s; probe batch within "
        f"{error:.1e} (relative) of torchao eager"
    )
    bert.compiled = compiled
    return bert.encode


def print_transformers_fidelity(tao: Torchao, holdout: dict[str, list[str]]) -> None:
    """transformers' ``BertModel`` (the default model's folder, mean pooling) quantized by
    torchao (its q, k, v, output and feed-forward ``nn.Linear``), against its own float32."""
    folder = default_model_dir()
    quantize_, config = tao  # type: ignore[misc]

    def prepare(model: nn.Module) -> None:
        quantize_(model.encoder, config())  # the pooler is not used by mean pooling

    peers = {
        "transformers float32": transformers_encoder(folder, 256),
        "transformers + torchao": transformers_encoder(folder, 256, prepare=prepare),
    }
    print_fidelity(peers, holdout, "transformers float32")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="1: CPU time is meaningful")
    ap.add_argument("--short", type=int, default=64, help="short texts timed")
    ap.add_argument("--paragraphs", type=int, default=8, help="paragraphs timed")
    ap.add_argument("--compile", action="store_true", help="time torchao compiled too")
    ap.add_argument("--transformers", action="store_true", help="transformers + torchao fidelity")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*truncated.*")
    env = environment()
    print(
        f"torch {env['torch']}, {args.threads} threads, {env['processor']}; capability "
        f"{env['cpu_capability']}; int8 instructions: {int8.cpu_int8_isa()}"
    )
    print(auto_line(env))
    tao = load_torchao()
    if tao is not None:
        import torchao

        print(f"torchao {torchao.__version__}; {kernel_line()}")
    peers: dict[str, Callable[[list[str]], object]] = {
        "float32": Bert.load(threads=args.threads).encode
    }
    start = time.perf_counter()
    try:
        peers["int8"] = Bert.load(dtype="int8", threads=args.threads).encode
    except ValueError as exc:  # no fast exact form here: torchao is still measured
        print_refusal(exc, time.perf_counter() - start)
    if tao is not None:
        peers["torchao"] = torchao_bert(tao, args.threads).encode
    holdout = {"short": short_texts(500), "paragraphs": stdlib_paragraph_corpus(100)}
    print_fidelity(peers, holdout, "float32")
    if tao is not None and args.compile:
        compiled = compile_torchao(torchao_bert(tao, args.threads))
        if compiled is not None:
            timed = {"short": holdout["short"][: args.short]}
            timed["paragraphs"] = holdout["paragraphs"][: args.paragraphs]
            print_fidelity({"float32": peers["float32"], "torchao compiled": compiled}, timed,
                           "float32")  # fmt: skip
            peers["torchao compiled"] = compiled
    print_cpu_time(peers, holdout, args)
    if tao is not None and args.transformers:
        print_transformers_fidelity(tao, holdout)


if __name__ == "__main__":
    main()
