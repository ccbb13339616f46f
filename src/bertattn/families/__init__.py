"""The architectures bertattn loads: one record per ``model_type`` in a registry
(:mod:`.registry`), one file per architecture. BERT, RoBERTa / XLM-RoBERTa and ELECTRA are name
maps on BERT's layer (:mod:`.bert`); DistilBERT and MPNet rename theirs (:mod:`.distilbert`,
:mod:`.mpnet`); ModernBERT (:mod:`.modernbert`) and the other rotary encoders are built from
:mod:`bertattn.blocks`."""

from .registry import CAPABILITIES, Family, get, lookup, names, register, require

__all__ = ["CAPABILITIES", "Family", "get", "lookup", "names", "register", "require"]
