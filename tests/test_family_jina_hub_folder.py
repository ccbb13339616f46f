"""Jina v3's released folder as the hub keeps it: an ``xlm-roberta`` config.json whose
``auto_map`` points at the LoRA remote code (``XLMRobertaLoRA``), the remote code's tensor names
under ``roberta.``, and every linear layer and embedding table stored as a parametrization: the
base weight (``parametrizations.weight.original``) and one low-rank update per task
(``parametrizations.weight.0.lora_A`` / ``lora_B``). The folder is written here from the
weights of a random native ``JinaEmbeddingsV3Model`` and random adapters; the update of a task
is merged by hand (plain torch, below) into the native weights, and the folder loaded with that
task must give those merged weights' hidden states."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from family_helpers import padded_batch
from safetensors.torch import save_file
from tiny_bert import save_random

from bertattn import Bert, BertModel
from bertattn.errors import ModelFolderError

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
    intermediate_size=29, max_position_embeddings=300, pad_token_id=0,
)  # fmt: skip
TASKS = ["retrieval.query", "retrieval.passage", "text-matching"]
RANK, ALPHA = 2, 3.0  # scale 1.5: a wrong scale, or none, changes every output
CODE = "jinaai/xlm-roberta-flash-implementation--"
TEXTS = ["the attention head looks at every token", "hello", "a model and a layer, ok"]


def _hub_config(**changes: object) -> dict:
    """jina-embeddings-v3's config.json (``XLMRobertaFlashConfig``'s fields; sizes tiny)."""
    config = {
        "architectures": ["XLMRobertaLoRA"],
        "auto_map": {
            "AutoConfig": f"{CODE}configuration_xlm_roberta.XLMRobertaFlashConfig",
            "AutoModel": f"{CODE}modeling_lora.XLMRobertaLoRA",
            "AutoModelForPreTraining": f"{CODE}modeling_xlm_roberta.XLMRobertaForPreTraining",
        },
        "attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "classifier_dropout": None,
        "emb_pooler": None, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": 36, "initializer_range": 0.02, "intermediate_size": 29,
        "layer_norm_eps": 1e-05, "load_trained_adapters": True, "lora_adaptations": TASKS,
        "lora_alpha": ALPHA, "lora_dropout_p": 0.0, "lora_main_params_trainable": False,
        "lora_rank": RANK, "matryoshka_dimensions": [12, 24, 36], "max_position_embeddings": 300,
        "model_type": "xlm-roberta", "num_attention_heads": 3, "num_hidden_layers": 3,
        "output_past": True, "pad_token_id": 0, "position_embedding_type": "rotary",
        "rotary_emb_base": 20000.0,
        "task_instructions": {"retrieval.query": "Represent the query: ",
                              "retrieval.passage": "Represent the document: ",
                              "text-matching": ""},
        "torch_dtype": "float32", "truncate_dim": None, "type_vocab_size": 1, "use_cache": True,
        "use_flash_attn": True, "use_reentrant": False, "vocab_size": 99,
    }  # fmt: skip
    config.update(changes)
    return config


def _layers(native: dict[str, torch.Tensor]) -> dict[str, tuple[list[str], bool]]:
    """Each adapted layer of the remote code (its name under ``roberta.``) -> the native
    weights it holds (q, k, v stacked for ``Wqkv``) and whether it is an embedding table."""
    out = {
        "embeddings.word_embeddings": (["embeddings.word_embeddings.weight"], True),
        "embeddings.token_type_embeddings": (["embeddings.token_type_embeddings.weight"], True),
        "pooler.dense": (["pooler.dense.weight"], False),
    }
    for i in range(SIZES["num_hidden_layers"]):
        src, dst = f"layers.{i}.", f"encoder.layers.{i}."
        out[f"{dst}mixer.Wqkv"] = ([f"{src}self_attn.{x}_proj.weight" for x in "qkv"], False)
        out[f"{dst}mixer.out_proj"] = ([f"{src}self_attn.o_proj.weight"], False)
        out[f"{dst}mlp.fc1"] = ([f"{src}mlp.fc1.weight"], False)
        out[f"{dst}mlp.fc2"] = ([f"{src}mlp.fc2.weight"], False)
    return out


def _adapters(native: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Random ``(lora_A, lora_B)`` per adapted layer: a linear ``(out, in)`` weight gets
    ``(T, r, in)`` and ``(T, out, r)``, an embedding ``(rows, width)`` ``(T, rows, r)`` and
    ``(T, r, width)``."""
    g = torch.Generator().manual_seed(11)
    out = {}
    for layer, (names, table) in _layers(native).items():
        rows = sum(native[n].shape[0] for n in names)
        cols = native[names[0]].shape[1]
        shapes = [(3, rows, RANK), (3, RANK, cols)] if table else [(3, RANK, cols), (3, rows, RANK)]
        out[layer] = tuple(torch.randn(s, generator=g) * 0.3 for s in shapes)
    return out


def _hub_tensors(native: dict[str, torch.Tensor], adapters: dict) -> dict[str, torch.Tensor]:
    """The native weights under the remote code's names, adapted layers as parametrizations."""
    out = {
        "roberta.emb_ln.weight": native["embeddings.LayerNorm.weight"],
        "roberta.emb_ln.bias": native["embeddings.LayerNorm.bias"],
        "roberta.pooler.dense.bias": native["pooler.dense.bias"],
    }
    for layer, (names, _) in _layers(native).items():
        top = f"roberta.{layer}.parametrizations.weight."
        out[top + "original"] = torch.cat([native[n] for n in names], dim=0)
        out[top + "0.lora_A"], out[top + "0.lora_B"] = adapters[layer]
    for i in range(SIZES["num_hidden_layers"]):
        src, dst = f"layers.{i}.", f"roberta.encoder.layers.{i}."
        out[f"{dst}mixer.Wqkv.bias"] = torch.cat(
            [native[f"{src}self_attn.{x}_proj.bias"] for x in "qkv"]
        )
        out[f"{dst}mixer.out_proj.bias"] = native[f"{src}self_attn.o_proj.bias"]
        for p in ("weight", "bias"):
            out[f"{dst}norm1.{p}"] = native[f"{src}post_attention_layernorm.{p}"]
            out[f"{dst}norm2.{p}"] = native[f"{src}post_mlp_layernorm.{p}"]
        for fc in ("fc1", "fc2"):
            out[f"{dst}mlp.{fc}.bias"] = native[f"{src}mlp.{fc}.bias"]
    return out


def _merged_by_hand(native: dict, adapters: dict, task: str) -> dict[str, torch.Tensor]:
    """The reference: task t's update ``alpha / r * B[t] @ A[t]`` (an embedding's
    ``A[t] @ B[t]``) added to each native weight, ``Wqkv``'s split by rows into q, k, v."""
    t = TASKS.index(task)
    out = {k: v.clone() for k, v in native.items()}
    for layer, (names, table) in _layers(native).items():
        a, b = adapters[layer]
        update = (a[t] @ b[t] if table else b[t] @ a[t]) * (ALPHA / RANK)
        for name, piece in zip(names, update.split([native[n].shape[0] for n in names]),
                               strict=True):  # fmt: skip
            out[name] += piece
    return out


@pytest.fixture(scope="module")
def jina(tmp_path_factory, tiny_checkpoint) -> dict:
    """The native folder, the released-form folder and the adapters."""
    import transformers

    root = tmp_path_factory.mktemp("jina-hub")
    cls = transformers.JinaEmbeddingsV3Model
    config = transformers.JinaEmbeddingsV3Config(**SIZES)
    hf = save_random(lambda c: cls(c, add_pooling_layer=True), config, root / "native", 9,
                     tiny_checkpoint)  # fmt: skip
    native = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    adapters = _adapters(native)
    hub = root / "hub"
    hub.mkdir()
    (hub / "config.json").write_text(json.dumps(_hub_config()))
    tensors = {k: v.contiguous() for k, v in _hub_tensors(native, adapters).items()}
    save_file(tensors, str(hub / "model.safetensors"))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_checkpoint / name).exists():
            shutil.copy(tiny_checkpoint / name, hub / name)
    return {"root": root, "native": root / "native", "hub": hub, "state": native,
            "adapters": adapters, "config": config}  # fmt: skip


def _merged_folder(jina: dict, task: str) -> tuple[Path, torch.nn.Module]:
    """A native folder of the hand-merged weights of ``task`` (and its transformers model)."""
    import transformers

    folder = jina["root"] / f"merged-{task}"
    model = transformers.JinaEmbeddingsV3Model(jina["config"], add_pooling_layer=True).eval()
    model.load_state_dict(_merged_by_hand(jina["state"], jina["adapters"], task))
    if not folder.exists():
        model.save_pretrained(folder)
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
            if (jina["native"] / name).exists():
                shutil.copy(jina["native"] / name, folder / name)
    return folder, model


def _batch() -> dict[str, torch.Tensor]:
    """Three padded rows, ``(3, 40)``."""
    ids, mask = padded_batch([40, 7, 23], seed=4)
    return {"input_ids": ids, "attention_mask": mask}


def _outputs(folder: Path, task: str | None = None, backend: str = "math") -> tuple:
    """Hidden states of the real tokens ``(T, E)`` and the pooler output ``(3, E)``."""
    batch = _batch()
    with torch.no_grad():
        out = BertModel.from_pretrained(folder, backend=backend, task=task)(**batch)
    return out.last_hidden_state[batch["attention_mask"].bool()], out.pooler_output


@pytest.mark.parametrize("task", TASKS)
def test_a_task_equals_the_weights_merged_by_hand(jina, task) -> None:
    merged, hf = _merged_folder(jina, task)
    model = BertModel.from_pretrained(jina["hub"], task=task)
    assert (model.config.family, model.task) == ("jina_embeddings_v3", task)
    assert model.task_names == tuple(TASKS)
    got, want = _outputs(jina["hub"], task), _outputs(merged)
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-6, rtol=0)
    batch = _batch()
    with torch.no_grad():
        theirs = hf(**batch)
    keep = batch["attention_mask"].bool()
    sdpa = _outputs(jina["hub"], task, "sdpa")
    torch.testing.assert_close(sdpa[0], theirs.last_hidden_state[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sdpa[1], theirs.pooler_output, atol=1e-5, rtol=1e-5)


def test_no_task_is_the_base_weights_and_tasks_differ(jina) -> None:
    """Without ``task`` the remote code runs the base weights: the native folder's outputs."""
    base = _outputs(jina["hub"])
    torch.testing.assert_close(base[0], _outputs(jina["native"])[0], atol=1e-6, rtol=0)
    query, passage = _outputs(jina["hub"], TASKS[0]), _outputs(jina["hub"], TASKS[1])
    assert not torch.allclose(query[0], passage[0], atol=1e-3)
    assert not torch.allclose(query[0], base[0], atol=1e-3)


def test_an_unknown_task_is_refused_naming_the_folders_tasks(jina) -> None:
    source = str(jina["hub"] / "config.json")
    message = (f"task='nope' is not one of the task adapters of {source}: retrieval.query, "
               f"retrieval.passage, text-matching; pass one of them, or no task for the base "
               f"weights.")  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(message)):
        BertModel.from_pretrained(jina["hub"], task="nope")


def test_a_task_for_a_folder_without_adapters_is_refused(jina, tiny_checkpoint) -> None:
    source = str(jina["native"] / "config.json")
    with pytest.raises(ValueError, match=re.escape(f"task='retrieval.query': {source} has no "
                                                   "task adapters")):  # fmt: skip
        BertModel.from_pretrained(jina["native"], task="retrieval.query")
    with pytest.raises(ValueError, match=r"task='x': BERT models \('bert'\) have no task adapters"):
        BertModel.from_pretrained(tiny_checkpoint, task="x")


def test_bert_load_with_a_task_encodes_the_merged_model(jina) -> None:
    """``Bert.load(folder, task=)``; ``encode(task=)`` takes the loaded task, refuses another
    with the way to load it, as sentence-transformers' ``encode(texts, task=...)`` selects it."""
    task = TASKS[1]
    merged, _ = _merged_folder(jina, task)
    bert = Bert.load(jina["hub"], task=task)
    want = Bert.load(merged).encode(TEXTS)
    got = bert.encode(TEXTS, task=task)
    assert abs(got - want).max() < 1e-6
    assert abs(bert.encode(TEXTS) - want).max() < 1e-6
    message = (f"task='{TASKS[0]}': this model was loaded with task='{task}' (the adapter is "
               f"merged into the weights as it loads); load it with Bert.load(..., "
               f"task='{TASKS[0]}').")  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(message)):
        bert.encode(TEXTS, task=TASKS[0])
    with pytest.raises(ValueError, match=r"task='nope' is not one of this model's task adapters"):
        bert.encode(TEXTS, task="nope")


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"lora_adaptations": []}, "lora_adaptations=[] is not supported; bertattn loads Jina "
      "embeddings v3 checkpoints with a non-empty list of distinct task names."),
     ({"lora_rank": 0}, "lora_rank=0 is not supported; bertattn loads Jina embeddings v3 "
      "checkpoints with an int >= 1."),
     ({"lora_rank": 3}, "the adapters of roberta.embeddings.token_type_embeddings are lora_A "
      "(3, 1, 2) and lora_B (3, 2, 36) for a weight of shape (1, 36); config.json's 3 "
      "lora_adaptations and lora_rank=3 need lora_A (3, 1, 3) and lora_B (3, 3, 36)."),
     ({"position_embedding_type": "absolute"}, "position_embedding_type='absolute' is not "
      "supported; bertattn loads Jina embeddings v3 checkpoints with "
      "position_embedding_type='rotary'.")],
)  # fmt: skip
def test_bad_adapter_settings_are_refused_by_field(jina, tmp_path, changes, message) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(jina["hub"], bad)
    (bad / "config.json").write_text(json.dumps(_hub_config(**changes)))
    with pytest.raises(ModelFolderError, match=re.escape(message)):
        BertModel.from_pretrained(bad, task=TASKS[0])


def test_a_plain_xlm_roberta_config_is_still_xlm_roberta(jina, tmp_path) -> None:
    """Only the released folder's ``auto_map`` / architecture claims an ``xlm-roberta``
    config for Jina v3."""
    from bertattn.encoder.config import BertConfig

    plain = {k: v for k, v in _hub_config().items() if k not in ("auto_map", "architectures")}
    plain["position_embedding_type"] = "absolute"
    assert BertConfig.from_dict(plain).family == "xlm-roberta"
    assert BertConfig.from_dict(_hub_config()).family == "jina_embeddings_v3"
    local = _hub_config(auto_map={"AutoModel": "modeling_lora.XLMRobertaLoRA"}, architectures=[])
    assert BertConfig.from_dict(local).family == "jina_embeddings_v3"


def test_encode_command_takes_the_task(jina, cli, tmp_path) -> None:
    """``bertattn encode --task``: the rows of the hand-merged model; an unknown task exits 2
    with one line naming the folder's tasks."""
    import numpy as np

    task = TASKS[2]
    merged, _ = _merged_folder(jina, task)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out.npy"
    r = cli("encode", tmp_path / "in.txt", "-o", out, "--model", jina["hub"], "--task", task)
    assert r.code == 0, r
    want = Bert.load(merged).encode(TEXTS)
    assert np.abs(np.load(out) - want).max() < 1e-6
    bad = cli("encode", tmp_path / "in.txt", "-o", tmp_path / "bad.npy", "--model", jina["hub"],
              "--task", "nope")  # fmt: skip
    assert bad.code == 2, bad
    lines = bad.err.strip().splitlines()
    assert len(lines) == 1 and "task='nope' is not one of the task adapters of" in lines[0], bad
    assert "retrieval.query, retrieval.passage, text-matching" in lines[0]
    assert not (tmp_path / "bad.npy").exists()


@pytest.mark.slow
def test_serve_takes_the_task(jina, cli, cli_subprocess) -> None:
    """``bertattn serve --task`` (a real server on a free loopback port): /v1/embeddings gives
    the hand-merged model's rows; an unknown task exits 2 in one line naming the folder's tasks;
    --task with several models is refused before anything loads."""
    import httpx
    import numpy as np
    from serve_server import running_server

    task = TASKS[0]
    merged, _ = _merged_folder(jina, task)
    want = Bert.load(merged, threads=1).encode(TEXTS)
    with running_server(cli_subprocess, jina["hub"], "--task", task) as server:
        body = {"input": TEXTS, "model": Path(jina["hub"]).name}
        got = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
        assert got.status_code == 200, got.text
        rows = np.array([d["embedding"] for d in got.json()["data"]], dtype=np.float32)
    assert np.abs(rows - want).max() < 1e-5
    bad = cli("serve", "--model", jina["hub"], "--task", "nope", "--port", "0")
    assert bad.code == 2, bad
    lines = bad.err.strip().splitlines()
    assert len(lines) == 1 and "task='nope' is not one of the task adapters of" in lines[-1], bad
    two = cli("serve", "--model", jina["hub"], "--model", jina["native"], "--task", task)
    assert two.code == 2 and "--task merges one task adapter into one model" in two.err, two
