"""The modern encoders at base size: bertattn ``Bert.encode`` against transformers' native classes
(sdpa) and OpenVINO f32 (the ONNX export of the same folder; optional: ``pip install -r
requirements-bench.txt``), fp32, peers in the same run, interleaved, medians; and ModernBERT's
long inputs layer kind by layer kind.

    python -m benchmarks.modern [--family modernbert,gte,nomic_bert] [--short 128]
                                [--passages 16] [--long 8192] [--lengths 1024,2048,4096,8192]
                                [--repeats 3] [--long-repeats 1] [--threads N] [--cpu-time]
                                [--no-openvino]

No base-size checkpoint of these architectures is installable here, so each is random weights
(seeded) at its released base size, saved by transformers (ModernBERT-base: 22 layers, 768 wide,
12 heads, GeGLU 1152, a global layer every 3, window 128; GTE-base and NomicBERT: 12 layers,
768, 3072), with all-MiniLM-L6-v2's WordPiece tokenizer (30,522 tokens; the work per token is
the real models' but for the embedding lookup).

Scenarios: short texts (standard-library docstring openings), passages (whole docstrings cut at
512 tokens), and for ModernBERT one document of ``--long`` tokens. Targets (issue 42):
ModernBERT >= 1.5x transformers and >= 1.2x OpenVINO f32 at every length; GTE and NomicBERT
>= 1.3x transformers on short texts and passages.

The long-input table: one sequence of L tokens through bertattn's encoder (packed: the local
layers skip the keys out of their window) with each layer timed on its own, summed per layer
kind (global / local), and the process's peak resident memory for that L (each L in a fresh
child process).

``--threads N`` runs every peer (and the long-input children) at N threads (default: torch's
count); ``--cpu-time`` times each call, and each layer, in this process's CPU seconds instead
of wall time (a shared machine; use it with ``--threads 1``). The one long document is timed
``--long-repeats`` times (default 1: it is the slow scenario).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bertattn import Bert
from bertattn.bench import environment, interleaved_medians
from bertattn.encoder.pipeline import default_model_dir

from .corpus import stdlib_docstring_corpus, stdlib_paragraph_corpus
from .openvino_peer import openvino_encoders

BASE = {
    "modernbert": ("ModernBertModel", "ModernBertConfig", dict(
        hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
        local_attention=128, global_attn_every_n_layers=3, max_position_embeddings=8192,
        pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
    )),
    "gte": ("GteModel", "GteConfig", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=8192, pad_token_id=0, type_vocab_size=2,
    )),
    "nomic_bert": ("NomicBertModel", "NomicBertConfig", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=8192, pad_token_id=0,
    )),
}  # fmt: skip
TARGETS = {
    "modernbert": {"transformers sdpa": 1.5, "openvino f32": 1.2},
    "gte": {"transformers sdpa": 1.3},
    "nomic_bert": {"transformers sdpa": 1.3},
}


def make_folder(family: str, root: Path, layers: int = 0) -> Path:
    """A random base-size folder of ``family`` with MiniLM's tokenizer (seeded); its first
    ``layers`` layers when > 0."""
    return random_folder(BASE[family], root / family, layers)


def random_folder(spec: tuple[str, str, dict], folder: Path, layers: int = 0) -> Path:
    """``spec`` (transformers' model class name, config class name, sizes) as a seeded random
    model saved to ``folder`` with MiniLM's tokenizer (30,522 tokens); its first ``layers``
    layers (and ``layer_types``) when > 0."""
    import transformers

    model_name, config_name, sizes = spec
    if layers:
        sizes = dict(sizes, num_hidden_layers=layers)
        if "layer_types" in sizes:
            sizes["layer_types"] = sizes["layer_types"][:layers]
    config = getattr(transformers, config_name)(vocab_size=30522, **sizes)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    model.save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, folder / name)
    return folder


def transformers_encoder(
    folder: Path,
    max_length: int,
    attn: str = "sdpa",
    prepare: Callable[[torch.nn.Module], None] | None = None,
) -> Callable[[list[str]], np.ndarray]:
    """transformers' native class (``attn``: its attention implementation, sdpa by default),
    length-sorted batches of 32, mean pooling, L2. ``prepare``: called on the loaded model
    before any encode (a quantizer, in place)."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder, attn_implementation=attn).eval()
    if prepare is not None:
        prepare(model)
    tok = transformers.AutoTokenizer.from_pretrained(folder)

    def encode(texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for s in range(0, len(order), 32):
                idx = order[s : s + 32]
                batch = tok([texts[i] for i in idx], padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")  # fmt: skip
                batch.pop("token_type_ids", None)
                hidden = model(**batch).last_hidden_state
                m = batch["attention_mask"][:, :, None].float()
                emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(emb, dim=-1).numpy()
        return out

    return encode


def bertattn_encoder(
    folder: Path, max_length: int, threads: int | None = None
) -> Callable[[list[str]], np.ndarray]:
    """``Bert.load(folder)`` (at ``threads`` when given) encoding with mean pooling, L2."""
    bert = Bert.load(folder, threads=threads)
    return lambda texts: bert.encode(
        texts, batch_size=32, pooling="mean", normalize=True, max_length=max_length
    )


def _timed(
    encoders: dict, texts: list[str], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """Seconds of each peer's call per round (interleaved, one warm-up each)."""
    timer = interleaved_medians({k: (lambda f=f: f(texts)) for k, f in encoders.items()},
                                repeats=repeats, warmup=1, clock=clock)  # fmt: skip
    return timer.samples


def _speeds(
    encoders: dict, texts: list[str], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    samples = _timed(encoders, texts, repeats, clock)
    return {k: len(texts) / float(np.median(samples[k])) for k in encoders}


def compare(family: str, folder: Path, args: argparse.Namespace) -> list[dict]:
    """Texts/s of every peer per scenario, with bertattn's ratios and the cosine to
    transformers."""
    short = stdlib_docstring_corpus(args.short)
    passages = stdlib_paragraph_corpus(args.passages)
    scenarios = [("short texts", short, 256), ("512-token passages", passages, 512)]
    if family == "modernbert" and args.long:
        doc = " ".join(stdlib_paragraph_corpus(400))
        scenarios.append((f"one {args.long}-token document", [doc], args.long))
    rows = []
    onnx = None
    if args.openvino:  # one export per family, compiled for every scenario
        try:
            from bertattn.deploy.onnx_export import export_onnx

            onnx = export_onnx(str(folder), folder.parent / f"{family}.onnx")
        except ImportError as exc:
            print(f"openvino peer missing: cannot export ONNX: {exc}")
    for name, texts, length in scenarios:
        encoders = {
            "bertattn": bertattn_encoder(folder, length, args.threads),
            "transformers sdpa": transformers_encoder(folder, length),
        }
        if args.openvino:
            tok = Bert.load(folder).tokenizer
            ov, _, why = openvino_encoders(folder, tok, ("f32",), onnx=onnx, max_length=length)
            encoders.update(ov)
            if why:
                print(why)
        want = encoders["transformers sdpa"](texts)
        cos = {k: float((f(texts) * want).sum(1).min()) for k, f in encoders.items()}
        repeats = args.repeats if len(texts) > 1 else args.long_repeats
        samples = _timed(encoders, texts, repeats, _clock(args.cpu_time))
        speed = {k: len(texts) / float(np.median(samples[k])) for k in encoders}
        rounds = {k: [t / o for t, o in zip(samples[k], samples["bertattn"], strict=True)]
                  for k in encoders if k != "bertattn"}  # fmt: skip
        rows.append({"family": family, "scenario": name, "speed": speed, "min_cosine": cos,
                     "rounds": rounds})  # fmt: skip
    return rows


def _peak_mib() -> float:
    """This process's peak resident memory in MiB: VmHWM (reset by exec, unlike ru_maxrss,
    which a child started from a large parent inherits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _clock(cpu_time: bool) -> Callable[[], float]:
    """This process's CPU seconds when ``cpu_time``, else wall seconds."""
    return time.process_time if cpu_time else time.perf_counter


def layer_kinds(
    folder: Path, length: int, threads: int | None = None, cpu_time: bool = False
) -> dict[str, object]:
    """One sequence of ``length`` tokens: seconds per layer kind (each layer timed on its own,
    packed; CPU seconds when ``cpu_time``) and this process's peak RSS."""
    clock = _clock(cpu_time)
    model = Bert.load(folder, threads=threads).model
    kinds = model.encoder.kinds
    spent = {"global": 0.0, "local": 0.0}
    started: dict[int, float] = {}

    def before(i: int) -> Callable[..., None]:
        return lambda mod, inp: started.__setitem__(i, clock())

    def after(i: int) -> Callable[..., None]:
        kind = "local" if kinds[i].window is not None else "global"
        return lambda mod, inp, out: spent.__setitem__(kind, spent[kind] + clock() - started[i])

    for i, layer in enumerate(model.encoder.layers):
        layer.register_forward_pre_hook(before(i))
        layer.register_forward_hook(after(i))
    ids = torch.randint(1000, 30000, (1, length))
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        model(ids, mask)  # warm
        spent["global"] = spent["local"] = 0.0
        t0 = clock()
        model(ids, mask)
        total = clock() - t0
    peak = _peak_mib()
    n_local = sum(1 for k in kinds if k.window is not None)
    return {
        "length": length, "total_s": total, "global_s": spent["global"], "local_s": spent["local"],
        "global_layers": len(kinds) - n_local, "local_layers": n_local, "peak_rss_mib": peak,
    }  # fmt: skip


def _print_rows(rows: list[dict]) -> None:
    for row in rows:
        fam, targets = row["family"], TARGETS[row["family"]]
        ours = row["speed"]["bertattn"]
        print(f"\n{fam}, {row['scenario']} (texts/s, median; min cosine to transformers)")
        for peer, speed in row["speed"].items():
            ratio = "" if peer == "bertattn" else f"  bertattn {ours / speed:.2f}x"
            target = targets.get(peer)
            verdict = ""
            if target is not None:
                verdict = f"  target {target}x: {'met' if ours / speed >= target else 'NOT met'}"
            print(f"  {peer:<20}{speed:>9.2f}  cos {row['min_cosine'][peer]:.6f}{ratio}{verdict}")
            if peer != "bertattn" and len(row["rounds"][peer]) > 1:
                each = " ".join(f"{r:.2f}x" for r in row["rounds"][peer])
                print(f"  {'':<20}bertattn per round (its time / ours): {each}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="modernbert,gte,nomic_bert")
    p.add_argument("--short", type=int, default=128)
    p.add_argument("--passages", type=int, default=16)
    p.add_argument("--long", type=int, default=8192)
    p.add_argument("--lengths", default="1024,2048,4096,8192")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--long-repeats", type=int, default=1, help="rounds for the long document")
    p.add_argument("--threads", type=int, default=None, help="default: torch's count")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time in CPU seconds, not wall time (a shared machine; use with --threads 1)",
    )
    p.add_argument("--no-openvino", dest="openvino", action="store_false")
    p.add_argument("--layer-kinds", type=int, default=0, help=argparse.SUPPRESS)  # child mode
    p.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # transformers' and OpenVINO's threads
    if args.layer_kinds:  # a child: one length, its own peak memory
        kinds = layer_kinds(Path(args.folder), args.layer_kinds, args.threads, args.cpu_time)
        print(json.dumps(kinds))
        return 0
    print(json.dumps(environment(), indent=1))
    with tempfile.TemporaryDirectory(prefix="bertattn-modern-") as tmp:
        rows = []
        for family in args.family.split(","):
            folder = make_folder(family, Path(tmp))
            rows += compare(family, folder, args)
            _print_rows(rows[-3:] if family == "modernbert" else rows[-2:])
            if family == "modernbert" and args.lengths:
                print("\nModernBERT, one sequence, packed: seconds per layer kind, peak RSS")
                print(f"{'L':>6}{'total s':>9}{'global s':>10}{'local s':>9}{'global %':>10}"
                      f"{'peak MiB':>10}")  # fmt: skip
                for length in [int(x) for x in args.lengths.split(",")]:
                    child = [sys.executable, "-m", "benchmarks.modern", "--layer-kinds",
                             str(length), "--folder", str(folder)]  # fmt: skip
                    if args.threads:
                        child += ["--threads", str(args.threads)]
                    if args.cpu_time:
                        child.append("--cpu-time")
                    out = subprocess.run(child, capture_output=True, text=True, check=True)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    share = r["global_s"] / max(r["global_s"] + r["local_s"], 1e-9)
                    layers = f"({r['global_layers']} global, {r['local_layers']} local layers)"
                    print(f"{length:>6}{r['total_s']:>9.2f}{r['global_s']:>10.2f}"
                          f"{r['local_s']:>9.2f}{share:>10.0%}{r['peak_rss_mib']:>10.0f}"
                          f"   {layers}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
