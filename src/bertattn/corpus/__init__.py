"""A job's input at corpus scale and its sharded output.

sources.py      files, folders, globs; plain, .gz, .zst; identity of each file
lines.py        bytes -> lines -> texts (UTF-8, JSON lines), by byte range or stream
embeddings.py   :func:`open_embeddings`: rows of a ``.npy`` file or a sharded output folder, in
                input order, memory-mapped
"""

from .embeddings import Embeddings, open_embeddings
from .sources import Corpus, InputFile, open_corpus

__all__ = ["Corpus", "Embeddings", "InputFile", "open_corpus", "open_embeddings"]
