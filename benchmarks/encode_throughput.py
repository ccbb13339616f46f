"""Sentences/s of `bertattn encode` vs `SentenceTransformer.encode` on ~500 real-ish sentences.

    PYTHONPATH=src python benchmarks/encode_throughput.py [N]

One timed run each after a warm-up; the CLI figure is its own summary line (encoding + writing,
model loading excluded). Short on purpose: the machine is shared.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBJECTS = [
    "The model",
    "A researcher",
    "Every attention head",
    "The tokenizer",
    "My neighbour",
    "The committee",
    "A small dog",
    "The new library",
    "This paper",
    "The weather",
]
VERBS = [
    "explains",
    "ignores",
    "attends to",
    "rewrites",
    "measures",
    "questions",
    "remembers",
    "compares",
    "describes",
    "predicts",
]
OBJECTS = [
    "the padding tokens",
    "a long sentence about rivers",
    "the results of last year",
    "every word in the paragraph",
    "the meaning of the question",
    "a quiet afternoon",
    "the price of coffee in Berlin",
    "the first layer's weights",
    "an old photograph",
    "the train schedule",
]
TAILS = [
    "",
    " before lunch",
    ", although nobody asked",
    " with surprising accuracy",
    " and then stops",
    ", which took three weeks and a great deal of patience from everyone involved in the project",
    " in 2017",
    ".",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        s += "".join(rng.choice(TAILS) for _ in range(rng.randint(0, 3)))
        out.append(s)
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    texts = sentences(n)
    src = Path(__file__).resolve().parents[1] / "src"
    with tempfile.TemporaryDirectory() as d:
        inp = Path(d) / "in.txt"
        inp.write_text("\n".join(texts) + "\n")
        env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
        cmd = [
            sys.executable,
            "-m",
            "bertattn",
            "encode",
            str(inp),
            "-o",
            str(Path(d) / "o.npy"),
            "-q",
        ]
        subprocess.run(cmd, env=env, check=True, capture_output=True)  # warm-up (disk cache)
        err = subprocess.run(cmd, env=env, check=True, capture_output=True).stderr.decode()
        cli_rate = float(re.search(r"([\d.]+) texts/s", err).group(1))

    from sentence_transformers import SentenceTransformer

    from bertattn.bert.pipeline import default_model_dir

    st = SentenceTransformer(str(default_model_dir()), device="cpu")
    st.encode(texts[:64], batch_size=32)  # warm-up
    t0 = time.perf_counter()
    st.encode(texts, batch_size=32)
    st_rate = n / (time.perf_counter() - t0)
    print(f"{n} sentences, torch threads {__import__('torch').get_num_threads()}")
    print(f"bertattn encode (CLI):       {cli_rate:8.1f} sentences/s")
    print(f"SentenceTransformer.encode:  {st_rate:8.1f} sentences/s")


if __name__ == "__main__":
    main()
