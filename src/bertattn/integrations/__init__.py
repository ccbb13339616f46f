"""Adapters that plug bertattn into other libraries. Each is a module of its own, imported on
demand (importing this package imports neither library):

* :mod:`bertattn.integrations.transformers`: importing it registers
  ``attn_implementation="bertattn"`` in Hugging Face transformers (the attention function and
  its mask function, together), so ``transformers.BertModel.from_pretrained(path,
  attn_implementation="bertattn")`` runs bertattn's backends.
* :mod:`bertattn.integrations.sentence_transformers`: :class:`BertattnTransformer`, a
  sentence-transformers input module running :class:`bertattn.BertModel`, and
  ``bertattn_sentence_transformer(path)``, a whole ``SentenceTransformer`` on it.
"""
