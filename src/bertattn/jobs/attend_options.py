"""``bertattn attend``'s options: :class:`AttendOptions` (the text, the model, the outputs and
the layer / head / ``--explain`` choices)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..files import overlapping
from .fields import (
    DEVICE_HELP,
    MAX_LENGTH_WHY,
    check_device,
    check_int,
    check_text,
    check_unicode,
    flag,
    option,
)

__all__ = ["AttendOptions"]


@dataclass
class AttendOptions:
    """``bertattn attend``: one text (or pair) in, its attention out."""

    text: str | None = option(
        None,
        "the text to look at; - reads it from stdin (or use --file)",
        positional=True,
        nargs="?",
    )
    file: str | None = option(None, "read the text from this UTF-8 file instead", metavar="PATH")
    pair: str | None = option(
        None, "a second text (segment B of a pair); for a multi-vector model, the document"
    )
    model: str | None = option(
        None, "model folder, hub name, or a name bertattn get-model made (default MiniLM)"
    )
    device: str = option("auto", f"where the model runs: {DEVICE_HELP} (default auto)")
    max_length: int | None = option(
        None,
        "tokens kept (default: the model folder's setting, 256 for MiniLM; at most the model's "
        "position limit, 512)",
        type=int,
    )
    layer: int | None = option(
        None,
        "layer shown large in the PNG, summarized, and opened in the page (default: 0; the "
        "page's own default view)",
        type=int,
    )
    head: int | None = option(
        None,
        "head shown large / summarized / the only head the page opens on (default: 0)",
        type=int,
    )
    png: str | None = option(None, "write a PNG (.png): every layer x head + one large")
    html: str | None = option(
        None, "write one self-contained interactive page (.html or .htm; - for stdout)"
    )
    json: str | None = option(None, "write the tokens and weights as JSON (.json; - for stdout)")
    rollout: bool = option(False, "add attention rollout to outputs")
    quiet: bool = option(
        False,
        "no status lines on stderr (warnings and errors still appear)",
        flags=("-q", "--quiet"),
    )
    explain: str | None = option(
        None,
        "print the article's steps (q·k, /√d, mask, softmax, Σ weights·v) for one head and one "
        "query token: LAYER:HEAD:TOKEN, TOKEN an index (0 is [CLS]) or the token's text (its "
        "first occurrence); its own layer and head, not --layer/--head",
        metavar="L:H:TOKEN",
    )
    steps: str | None = option(
        None,
        "layers whose q/k/v go into the page's step view: 0,2 or all (default: --layer)",
        metavar="LAYERS",
    )

    def __post_init__(self) -> None:
        cls = type(self)
        if self.text is not None and self.file is not None:
            raise UsageError("give the text or --file PATH, not both.")
        check_unicode(cls, self, "text", "pair", "explain", "steps")
        if self.text is None and self.file is None:
            raise UsageError("no text: give TEXT, - to read stdin, or --file PATH.")
        if self.text is not None and (not isinstance(self.text, str) or not self.text.strip()):
            raise UsageError("TEXT is empty; give the sentence whose attention you want to see.")
        if self.pair is not None and (not isinstance(self.pair, str) or not self.pair.strip()):
            raise UsageError("--pair is empty; drop it or give a second sentence.")
        for name in ("model", "file"):
            check_text(cls, self, name)
        check_device(cls, self)
        check_int(
            cls,
            self,
            "max_length",
            low=5 if self.pair is not None else 3,
            because=(
                "[CLS], [SEP], [SEP] and at least one token of each text of the pair"
                if self.pair is not None
                else MAX_LENGTH_WHY
            ),
        )
        for name in ("layer", "head"):  # the range depends on the model: checked by the job
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"{flag(cls, name)} must be an integer, got {value!r}.")
        outputs = [str(p) for p in (self.png, self.html, self.json) if p is not None]
        for name in ("png", "html", "json"):
            check_text(cls, self, name)
        twice = ("-", "-") if outputs.count("-") > 1 else overlapping(outputs)
        if twice is not None:
            raise UsageError(f"one file is named for two outputs ({twice[0]} and {twice[1]}).")
        if self.explain is not None and "-" in outputs:
            raise UsageError(
                "--explain prints the article's steps on stdout, where the output asked for as "
                "- would go too: write that output to a file, or run --explain on its own."
            )
        if self.png == "-":
            raise UsageError("--png - is not supported (a PNG is binary); give a file name.")
        if self.explain is not None:
            self._check_explain_layer_head()
        elif self.json is not None and self.png is None and self.html is None:
            given = [flag(cls, n) for n in ("layer", "head") if getattr(self, n) is not None]
            if given:  # the JSON holds every layer and head; nothing else is drawn
                raise UsageError(
                    f"{' and '.join(given)} {'do' if len(given) > 1 else 'does'} nothing "
                    f"with --json alone: the JSON holds every layer and head, and only --png, "
                    f"--html and the printed summary show one; drop {' and '.join(given)}, or "
                    f"add --png/--html."
                )
        if self.steps is not None:
            if self.html is None:
                raise UsageError("--steps chooses layers for the page's step view; add --html.")
            self.steps_layers(None)

    @property
    def outputs(self) -> list[tuple[str, str]]:
        """``(path, kind)`` of the files asked for."""
        return [
            (p, k)
            for p, k in ((self.png, "PNG"), (self.html, "HTML"), (self.json, "JSON"))
            if p is not None
        ]

    def _check_explain_layer_head(self) -> None:
        """``--explain`` has its own layer and head; ``--layer`` / ``--head`` choose the picture
        (PNG, page). With no picture they would do nothing: refused when they differ."""
        layer, head, _ = self.explain_target()
        if self.png is not None or self.html is not None:
            return
        cls = type(self)
        given = [
            (name, value)
            for name, value, own in (("layer", self.layer, layer), ("head", self.head, head))
            if value is not None and value != own
        ]
        if not given:
            return
        token = str(self.explain).split(":", 2)[2]
        named = " and ".join(f"{flag(cls, name)} {value}" for name, value in given)
        wanted = dict(given)
        raise UsageError(
            f"{named} {'do' if len(given) > 1 else 'does'} nothing here: --explain {self.explain} "
            f"explains its own layer {layer}, head {head}, and only --png and --html draw "
            f"--layer/--head. Put them in --explain (--explain {wanted.get('layer', layer)}:"
            f"{wanted.get('head', head)}:{token}), drop them, or add --png/--html for a picture."
        )

    def explain_target(self) -> tuple[int, int, int | str]:
        """``--explain LAYER:HEAD:TOKEN`` as ``(layer, head, token)`` (token: index or text)."""
        parts = str(self.explain).split(":", 2)
        try:
            if len(parts) != 3 or not parts[2]:
                raise ValueError
            layer, head = int(parts[0]), int(parts[1])
        except ValueError:
            raise UsageError(
                f"--explain {self.explain!r}: expected LAYER:HEAD:TOKEN, e.g. 2:0:it or 2:0:5."
            ) from None
        token = parts[2]
        return layer, head, int(token) if token.lstrip("-").isdigit() else token

    def steps_layers(self, num_layers: int | None) -> list[int]:
        """The layers whose q/k/v the page embeds (``num_layers`` checks the range)."""
        if self.html is None:
            return []
        if self.steps is None:
            chosen = [self.layer or 0]
        elif self.steps.strip().lower() == "all":
            chosen = list(range(num_layers or 0))
        else:
            try:
                chosen = sorted({int(x) for x in self.steps.split(",") if x.strip()})
            except ValueError:
                raise UsageError(
                    f"--steps {self.steps!r}: expected layer numbers like 0,2 or all."
                ) from None
            if not chosen:
                raise UsageError("--steps is empty; give layer numbers like 0,2 or all.")
        if num_layers is not None:
            bad = [i for i in chosen if not 0 <= i < num_layers]
            if bad:
                raise UsageError(
                    f"--steps {bad[0]} is out of range: this model has layers 0..{num_layers - 1}."
                )
        return chosen
