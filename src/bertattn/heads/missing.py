"""What sentence-transformers 6's ``CrossEncoder``, ``SparseEncoder`` and ``MultiVectorEncoder``
have that bertattn's head classes do not, each with bertattn's equivalent or, where there is
none, what to use instead: one table for the three classes. A head class asked for one of these
names raises an ``AttributeError`` whose one line says so (:func:`missing_attribute`), instead
of Python's bare "object has no attribute"."""

from __future__ import annotations

import torch

__all__ = ["MISSING", "missing_attribute"]

_TRAIN = (
    "bertattn runs inference only: train with sentence-transformers (its trainer or fit), save "
    "the folder, and load it here"
)
_DEVICE = (
    "a head class is not a torch module: choose the device when loading ({cls}(folder, "
    "device='cuda')) or per call (encode(..., device=...))"
)
_DTYPE = "choose the compute dtype when loading: {cls}(folder, dtype=torch.float16)"
_TORCH = (
    "a head class is not a torch module; its encoder is .model (a torch.nn.Module: "
    "model.model.{name}(...)), the head's layers are its own attributes"
)
_HUB = (
    "bertattn does not upload: save(folder), then upload it with huggingface_hub "
    "(HfApi().upload_folder)"
)
_POOL = (
    "bertattn encodes in this process, on one device (threads= sets its CPU threads); for many "
    "clients run `bertattn serve`"
)
_PEFT = (
    "PEFT adapters are not supported: merge the adapter into the model (peft's "
    "merge_and_unload), save it, and load that folder"
)
_MODULES = (
    "bertattn's head classes are not module lists: the modules are read from the folder's "
    "modules.json (build another pipeline with sentence-transformers and save it)"
)
_TOKENIZE = "tokenize with .tokenizer (model.tokenizer(texts): ids, attention mask, tokens)"
_TEXT = "bertattn's head classes take text only"
_NONE = "not offered by bertattn"


def _each(names: str, message: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), message)


#: attribute name -> what to use instead (``{cls}``: the class's name, ``{name}``: the name)
MISSING: dict[str, str] = {
    **_each(
        "fit old_fit smart_batching_collate smart_batching_collate_text_only train zero_grad "
        "requires_grad_ gradient_checkpointing_enable activation_checkpointing_enable",
        _TRAIN,
    ),
    "evaluate": "call the evaluator on the model: evaluator(model) (its metrics are kept on "
    "model.model_card_data)",
    **_each("to cuda cpu xpu mtia ipu", _DEVICE),
    **_each("half float double bfloat16 type", _DTYPE),
    **_each(
        "parameters named_parameters buffers named_buffers children named_children modules "
        "named_modules state_dict load_state_dict apply smart_apply forward compile get_submodule "
        "eval",
        _TORCH,
    ),
    "transformers_model": "the encoder is .model, bertattn's BertModel (not a transformers "
    "model); load the folder with transformers for one",
    **_each("push_to_hub save_to_hub", _HUB),
    **_each("start_multi_process_pool stop_multi_process_pool", _POOL),
    **_each(
        "add_adapter load_adapter set_adapter delete_adapter active_adapter active_adapters "
        "enable_adapters disable_adapters get_adapter_state_dict has_peft_compatible_model "
        "check_peft_compatible_model merge",
        _PEFT,
    ),
    **_each("append extend insert pop", _MODULES),
    **_each("tokenize preprocess processor", _TOKENIZE),
    **_each("modalities supports is_singular_input", _TEXT),
    "get_device_name": "the device is .device",
    "get_backend": "bertattn runs torch; its attention backend is the backend= argument of the "
    "constructor",
    "model_type": "the class is the type: type(model).__name__",
    "splade_pooling_chunk_size": "SparseEncoder(folder, chunk_tokens=...) sets the tokens "
    "whose logits are pooled at a time",
    "SUPPORTED_SIMILARITY_FN_NAMES": "similarity_fn_name takes 'maxsim' or 'meanmaxsim'",
    **_each(
        "get_model_kwargs clear_placement_cache set_keep_in_fp32_modules "
        "set_pooling_include_prompt model_card_data_class default_huggingface_organization",
        _NONE,
    ),
}

#: the rest of torch.nn.Module's surface (hooks, buffers, ...): the encoder module's
MISSING.update(
    {n: _TORCH for n in dir(torch.nn.Module) if not n.startswith("_") and n not in MISSING}
)


def missing_attribute(cls: str, name: str) -> AttributeError:
    """The ``AttributeError`` for ``name`` on an instance of head class ``cls``: the table's
    pointer when sentence-transformers' classes have it, else Python's own words."""
    hint = MISSING.get(name)
    if hint is None:
        return AttributeError(f"{cls!r} object has no attribute {name!r}")
    return AttributeError(
        f"{cls} has no {name!r} (a sentence-transformers attribute): "
        f"{hint.format(cls=cls, name=name)}."
    )
