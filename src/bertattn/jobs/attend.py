"""The attend job: one text (or pair) in, its attention out: a text summary, the article's steps
for one head and token, or PNG / HTML / JSON files written all together or not at all."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..files import check_output
from ..maps import AttentionMaps
from . import attend_maxsim
from .attend_options import AttendOptions
from .fields import flag, job_device
from .inputs import check_input, stdin_buffer

if TYPE_CHECKING:
    from ..encoder import Bert
    from ..encoder.steps import AttentionSteps
    from ..heads.registry import FolderProbe, HeadKind

__all__ = ["AttendResult", "read_text", "run_attend"]


@dataclass
class AttendResult:
    """The maps computed, the files written (in PNG, HTML, JSON order), the steps asked for
    with ``--explain``, the warnings raised while computing (e.g. truncation), and notes on
    how the options were read (e.g. which of several equal tokens ``--explain`` took; the
    command prints them as warnings unless ``-q``)."""

    maps: AttentionMaps
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    steps: AttentionSteps | None = None
    stdout: bytes | None = None  # the output asked for as ``-`` (JSON or HTML), for stdout
    notes: list[str] = field(default_factory=list)
    #: what a classifier or reranker decided on the text (pair), e.g. "positive 0.912"; also in
    #: the titles of the PNG and the page. None: the model has no such head. For a
    #: multi-vector model: the MaxSim summary (score, then each query token's match)
    prediction: str | None = None
    #: a multi-vector model's MaxSim of TEXT (the query) against --pair (the document)
    maxsim: attend_maxsim.MaxSimView | None = None


#: the suffixes each output takes (lower case); the format comes from the option, not the name
SUFFIXES: dict[str, tuple[str, ...]] = {
    "PNG": (".png",),
    "HTML": (".html", ".htm"),
    "JSON": (".json",),
}


def _check_range(name: str, value: int, count: int) -> None:
    if not 0 <= value < count:
        raise UsageError(
            f"{flag(AttendOptions, name)} {value} is out of range: this model has {name}s "
            f"0..{count - 1}."
        )


def _check_explain_part(spec: str, name: str, value: int, count: int) -> None:
    """``--explain``'s layer or head, named as a part of ``--explain`` (not ``--layer``)."""
    if 0 <= value < count:
        return
    parts = spec.split(":", 2)
    parts[0 if name == "layer" else 1] = str(count - 1 if value >= count else 0)
    raise UsageError(
        f"--explain {spec}: {name} {value} is out of range; this model has {name}s "
        f"0..{count - 1}: give one of those, e.g. --explain {':'.join(parts)}."
    )


def _shown(text: str, limit: int = 40) -> str:
    """``text`` as Python writes it in ASCII (invisible characters spelled out), cut short."""
    return ascii(text[:limit]) + (" ..." if len(text) > limit else "")


def _tokens(bert: Bert, text: str, pair: str | None, max_length: int | None) -> list[str]:
    """The tokens the model will see (truncation is reported once, by the model's run)."""
    limit = bert.max_length if max_length is None else max_length
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = bert.tokenizer([text], None if pair is None else [pair], max_length=limit)
    return list(batch.tokens[0])


def _check_known_tokens(bert: Bert, options: AttendOptions, text: str) -> None:
    """Refuse a text (or pair) of which the tokenizer keeps nothing: only characters it drops
    (control, format, zero-width), so that only [CLS] and [SEP] would remain."""
    for what, value, fix in (
        ("the text", text, "give a text with words in it"),
        ("--pair", options.pair, "give a second text with words in it, or drop --pair"),
    ):
        if value is not None and len(_tokens(bert, value, None, options.max_length)) <= 2:
            raise UsageError(
                f"{what} has no token the model knows (only [CLS] and [SEP] remain): "
                f"{_shown(value)} holds only characters the tokenizer drops (control, format or "
                f"zero-width characters); {fix}."
            )


def _explain_query(spec: str, token: int | str, tokens: list[str]) -> tuple[int, str | None]:
    """``--explain``'s TOKEN as an index into ``tokens``, and a note when its text occurs
    more than once (the first is taken). A negative index is refused like one past the end."""
    from ..encoder.steps import find_token, find_tokens

    last = len(tokens) - 1
    if isinstance(token, int):
        if not 0 <= token <= last:
            raise UsageError(
                f"--explain {spec}: token index {token} is out of range: the text has tokens "
                f"0..{last} (0 is {tokens[0]}, {last} is {tokens[last]}); give an index in "
                f"0..{last} or the token's text."
            )
        return token, None
    try:
        first = find_token(tokens, token)
    except ValueError as exc:
        raise UsageError(f"--explain {spec}: {exc}") from None
    same = find_tokens(tokens, token)
    if len(same) < 2:
        return first, None
    layer_head = ":".join(spec.split(":", 2)[:2])
    others = [str(i) for i in same if i != first]
    note = (
        f"--explain {spec}: {token!r} occurs {len(same)} times in the text; explaining the "
        f"first, token {first} (the other{'s' if len(others) > 1 else ''}: {', '.join(others)}); "
        f"to explain another, give its index, e.g. --explain {layer_head}:{others[0]}."
    )
    return first, note


def read_text(options: AttendOptions) -> str:
    """The text: as given, from stdin (``-``) or from ``--file`` (UTF-8; a final newline is
    not part of the text)."""
    from ..corpus.lines import MAX_LINE, refuse_compressed

    if options.file is None and options.text != "-":
        return str(options.text)
    name = "<stdin>" if options.file is None else str(options.file)
    if options.file is None:
        raw = stdin_buffer("attend -").read(MAX_LINE + 1)
    else:
        with check_input(options.file, what="--file", stream=True).open("rb") as f:
            raw = f.read(MAX_LINE + 1)
    if len(raw) > MAX_LINE:  # /dev/zero, a binary file: not read on without end
        raise ValueError(
            f"{name}: longer than {MAX_LINE >> 20} MiB, the most attend reads as its text; "
            f"give a text file (attend keeps only the first --max-length tokens anyway)."
        )
    refuse_compressed(raw, name, by_name=False)
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{name}: invalid UTF-8 at byte {exc.start}; convert the file to UTF-8 first."
        ) from None
    if not text.strip():
        raise UsageError(f"{name} holds no text; give the sentence whose attention you want.")
    return text


def _load(kind: HeadKind, probe: FolderProbe, device: object) -> tuple[Bert, object | None]:
    """The encoder to show, and the head over it (None for a model without one), as the
    kind's record says (its ``attend`` view): a reranker or classifier is loaded as a
    :class:`bertattn.CrossEncoder`, so the page can say what it decided; a multi-vector
    folder as a :class:`bertattn.MultiVectorEncoder`, so the page can show what each query
    token matched."""
    if kind.attend == "encoder":
        from ..encoder import Bert

        return Bert.load(kind.encoder(probe), device=device), None  # type: ignore[arg-type]
    head = kind.load(probe, device=device)  # type: ignore[misc]
    return head.bert, head


def _decision(head: object, text: str, pair: str | None, max_length: int | None) -> str:
    """What ``head`` decided on the text (pair), in words: a reranker's score, or a
    classifier's label and its probability."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation was reported with the maps
        if max_length is not None:
            head.bert.max_length = max_length  # type: ignore[attr-defined]
        logits = head.logits([text if pair is None else (text, pair)])[0]  # type: ignore[attr-defined]
    if head.num_labels == 1:  # type: ignore[attr-defined]
        score = float(head.activation_fn(logits[None])[0, 0])  # type: ignore[attr-defined]
        return f"score {score:.3f}"
    probs = torch.softmax(logits, dim=-1)
    best = int(probs.argmax())
    return f"{head.id2label[best]} {float(probs[best]):.3f}"  # type: ignore[attr-defined]


def run_attend(options: AttendOptions) -> AttendResult:
    """Compute the attention of the text and write the files asked for.

    Every output path (and its suffix: :data:`SUFFIXES`) is checked before the model loads;
    ``layer`` / ``head`` / ``max_length`` / ``--steps`` / ``--explain`` and a text of which the
    tokenizer keeps nothing are refused before the model runs; the files are rendered first
    and written together (:func:`bertattn.files.write_all`).
    """
    from ..heads.registry import detect

    _check_outputs(options)
    kind, probe = detect(options.model)
    if options.pair is None and kind.attend == "maxsim":
        raise attend_maxsim.need_pair()
    device = job_device(options.device)
    text = read_text(options)
    bert, decider = _load(kind, probe, device)
    the_query, pair = text, options.pair  # a multi-vector model's query: TEXT as given
    multi_vector = options.pair is not None and kind.attend == "maxsim"
    if multi_vector:  # the attention of the pair each with its task's prompt
        text, pair = attend_maxsim.attention_texts(decider, the_query, options.pair)  # type: ignore[arg-type]
    cfg = bert.model.config
    _check_sizes(options, cfg)
    qkv_layers, no_steps, notes = _steps_plan(options, cfg)
    target = None
    if options.explain is not None:
        layer, head, token = options.explain_target()
        _check_explain_part(options.explain, "layer", layer, cfg.num_hidden_layers)
        _check_explain_part(options.explain, "head", head, cfg.num_attention_heads)
    _check_known_tokens(bert, options, text)
    if options.explain is not None:
        tokens = _tokens(bert, text, pair, options.max_length)
        query, note = _explain_query(options.explain, token, tokens)
        target = (layer, head, query)
        notes += [note] if note else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = bert.attention_maps(text, pair, max_length=options.max_length, qkv_layers=qkv_layers)
    result = AttendResult(maps, warnings=[str(w.message) for w in caught], notes=notes)
    if multi_vector:
        _add_maxsim(result, decider, the_query, options.pair)  # type: ignore[arg-type]
    elif decider is not None:
        result.prediction = _decision(decider, text, options.pair, options.max_length)
        maps.model_name = f"{maps.model_name} · {result.prediction}"
    if target is not None:
        result.steps = _explain_steps(bert, options, text, pair, target)
    _render(result, options, no_steps)
    return result


def _check_outputs(options: AttendOptions) -> None:
    """Each output path (not ``-``) can be written, with its suffix, before any work."""
    inputs = [] if options.file is None else [options.file]
    for path, kind in options.outputs:
        if path != "-":
            check_output(path, what=f"--{kind.lower()}", inputs=inputs, suffixes=SUFFIXES[kind])


def _check_sizes(options: AttendOptions, cfg: Any) -> None:
    """``--layer``, ``--head`` and ``--max-length`` within what the model (``cfg``) has."""
    _check_range("layer", options.layer or 0, cfg.num_hidden_layers)
    _check_range("head", options.head or 0, cfg.num_attention_heads)
    limit = cfg.max_position_embeddings
    if options.max_length is not None and options.max_length > limit:
        raise UsageError(
            f"--max-length {options.max_length} exceeds what the model takes "
            f"(max_position_embeddings {limit}); use --max-length {limit} or less."
        )


def _steps_plan(options: AttendOptions, cfg: Any) -> tuple[list[int], str | None, list[str]]:
    """The layers whose q, k, v the page's steps view gets; why the family has no steps view
    (None when it has one: for the page); the notes to show. ``--steps`` asked for by name on a
    family without the view is refused before the model runs."""
    from ..families import registry as families

    qkv_layers = options.steps_layers(cfg.num_hidden_layers)
    family = families.get(cfg.family)
    if family.can("steps"):
        return qkv_layers, None, []
    why = family.why_not("steps")
    if not qkv_layers:
        return qkv_layers, why, []
    if options.steps is not None:
        raise UsageError(
            f"--steps: the page's steps view recomputes softmax(q·k/√d_k + mask) in the "
            f"browser and has no step for {why}; leave --steps out "
            f"(the page then has the head view only), and use --explain L:H:TOKEN for the "
            f"article's steps on the values the model computed."
        )
    note = (
        f"the page has no steps view for {family.title} models (it would need a step for "
        f"{why}); --explain L:H:TOKEN shows the article's steps"
    )
    return [], why, [note]


def _add_maxsim(result: AttendResult, decider: object, query: str, document: str) -> None:
    """A multi-vector model's MaxSim of the pair, into ``result`` and the page's title."""
    try:
        result.maxsim = attend_maxsim.compute_maxsim(decider, query, document)  # type: ignore[arg-type]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result.prediction = result.maxsim.summary()
    name = "mean-MaxSim" if result.maxsim.similarity_fn_name == "meanmaxsim" else "MaxSim"
    result.maps.model_name = f"{result.maps.model_name} · {name} {result.maxsim.total:.3f}"


def _explain_steps(
    bert: Bert,
    options: AttendOptions,
    text: str,
    pair: str | None,
    target: tuple[int, int, int],
) -> AttentionSteps:
    """``--explain``: the article's steps for ``target`` (layer, head, query token)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation was reported with the maps
        try:
            return bert.attention_steps(
                text,
                layer=target[0],
                head=target[1],
                query=target[2],
                pair=pair,
                max_length=options.max_length,
            )
        except ValueError as exc:
            raise UsageError(f"--explain {options.explain}: {exc}") from None


def _render(result: AttendResult, options: AttendOptions, no_steps: str | None) -> None:
    """The files asked for, rendered and written together, and what goes to stdout (``-``)."""
    from .. import viz

    maps = result.maps
    files = {
        k: (None if p == "-" else p) for k, p in (("html", options.html), ("json", options.json))
    }
    dash = "-" in (options.html, options.json)
    views = {
        "png": options.png,
        "html": files["html"],
        "json_path": files["json"],
        "layer": options.layer,
        "head": options.head,
        "rollout": options.rollout,
    }
    if result.maxsim is not None:
        if options.png or any(files.values()) or dash:
            to = "JSON" if options.json == "-" else "HTML" if options.html == "-" else None
            result.written, result.stdout = attend_maxsim.render_outputs(
                maps, result.maxsim, stdout=to, **views
            )
        return
    if options.png or any(files.values()):
        result.written = viz.render_all(maps, no_steps=no_steps, **views)
    if dash:
        roll = viz.attention_rollout(maps) if options.rollout else None
        if options.json == "-":
            result.stdout = viz.render_json(maps, rollout=roll)
        else:
            page = viz.render_html(
                maps, rollout=roll, layer=options.layer, head=options.head, no_steps=no_steps
            )
            result.stdout = page.encode("utf-8")
