"""`bertattn attend`'s messages for what a user gets wrong: --explain's parts named as such, a
negative token index, a token that occurs twice, --layer/--head that --explain ignores, output
suffixes, a closed stdout, and a text of which the tokenizer keeps nothing."""

from __future__ import annotations

import subprocess

import pytest

TEXT = "hi"  # [CLS] hi [SEP]: tokens 0..2


def _refused(r, code: int, *messages: str) -> None:
    assert r.code == code, r
    for message in messages:
        assert message in r.err, r
    assert "Traceback" not in r.err, r
    assert r.err.count("bertattn attend: error: ") == 1, r


# ---------------------------------------------------------------------- 1. --explain's parts
@pytest.mark.parametrize(
    "spec, message",
    [
        ("6:0:hi", "--explain 6:0:hi: layer 6 is out of range; this model has layers 0..5"),
        ("0:12:hi", "--explain 0:12:hi: head 12 is out of range; this model has heads 0..11"),
    ],
)
def test_explain_layer_or_head_out_of_range_names_explain(cli, tmp_path, spec, message):
    r = cli("attend", TEXT, "--explain", spec, "--png", "a.png", cwd=tmp_path)
    _refused(r, 2, message, "give one of those, e.g. --explain ")
    assert "--layer" not in r.err and "--head " not in r.err  # the user gave neither
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- 2. token index range
@pytest.mark.parametrize("index", ["-1", "-3", "3"])
def test_explain_token_index_negative_or_past_the_end_is_refused(cli, tmp_path, index):
    r = cli("attend", TEXT, "--explain", f"2:0:{index}", "--png", "a.png", cwd=tmp_path)
    _refused(
        r,
        2,
        f"--explain 2:0:{index}: token index {index} is out of range: the text has tokens 0..2",
        "give an index in 0..2 or the token's text",
    )
    assert r.out == ""
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- 3. a repeated token
def test_explain_repeated_token_takes_the_first_and_says_so(cli):
    r = cli("attend", "the cat saw the dog", "--explain", "2:0:the")
    assert r.code == 0, r
    assert "layer 2, head 0, query 1 'the'" in r.out
    assert (
        "bertattn attend: warning: --explain 2:0:the: 'the' occurs 2 times in the text; "
        "explaining the first, token 1 (the other: 4); to explain another, give its index, "
        "e.g. --explain 2:0:4." in r.err
    ), r
    quiet = cli("attend", "the cat saw the dog", "--explain", "2:0:the", "-q")
    assert quiet.code == 0 and quiet.err == "", quiet
    assert quiet.out == r.out
    single = cli("attend", "the cat saw a dog", "--explain", "2:0:the")  # once: no warning
    assert single.code == 0 and "warning" not in single.err, single


# ---------------------------------------------------------------------- 4. --layer/--head
@pytest.mark.parametrize(
    "extra, named, fix",
    [
        (["--layer", "3", "--head", "4"], "--layer 3 and --head 4 do nothing here", "3:4:hi"),
        (["--layer", "3"], "--layer 3 does nothing here", "3:0:hi"),
        (["--head", "4"], "--head 4 does nothing here", "2:4:hi"),
    ],
)
def test_explain_with_layer_head_and_no_picture_is_refused(cli, tmp_path, extra, named, fix):
    r = cli("attend", TEXT, "--explain", "2:0:hi", *extra, "--json", "a.json", cwd=tmp_path)
    _refused(
        r,
        2,
        f"{named}: --explain 2:0:hi explains its own layer 2, head 0, and only --png and "
        f"--html draw --layer/--head. Put them in --explain (--explain {fix}), drop them, or "
        f"add --png/--html for a picture.",
    )
    assert list(tmp_path.iterdir()) == []


def test_explain_keeps_layer_head_that_agree_or_draw_a_picture(cli, tmp_path):
    r = cli("attend", TEXT, "--explain", "2:0:hi", "--layer", "3", "--head", "4", cwd=tmp_path)
    assert r.code == 2, r  # nothing draws them: refused (the check that fails before the fix)
    same = cli("attend", TEXT, "--explain", "2:0:hi", "--layer", "2", "--head", "0")
    assert same.code == 0 and "layer 2, head 0, query 1 'hi'" in same.out, same
    drawn = cli(
        "attend", TEXT, "--explain", "2:0:hi", "--layer", "3", "--png", "a.png", cwd=tmp_path
    )
    assert drawn.code == 0, drawn  # --layer picks the PNG's large head; --explain its own
    assert "layer 2, head 0, query 1 'hi'" in drawn.out
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]


# ---------------------------------------------------------------------- 5. output suffixes
@pytest.mark.parametrize(
    "option, name, expected",
    [
        ("--png", "a.jpg", "use .png."),
        ("--png", "a", "use .png."),
        ("--json", "x.yaml", "use .json."),
        ("--html", "a.txt", "use .html or .htm."),
    ],
)
def test_output_suffix_must_match_its_format(cli, tmp_path, option, name, expected):
    # --model names a missing folder: the refusal comes before the model loads
    r = cli("attend", TEXT, option, name, "--model", "nomodel/", cwd=tmp_path)
    suffix = "." + name.split(".")[1] if "." in name else "(no suffix)"
    _refused(
        r,
        2,
        f"{option} {name}: unknown format '{suffix}'; the format is taken from the suffix: "
        f"{expected}",
    )
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- 6. closed stdout
def test_json_to_a_stdout_closed_early_exits_141(cli_subprocess, tmp_path):
    text = " ".join(["word"] * 60)  # ~6 MB of JSON: far more than a pipe holds
    with cli_subprocess.popen(
        "attend", text, "-q", "--json", "-", cwd=tmp_path, stdout=subprocess.PIPE
    ) as proc:
        assert proc.stdout.read(1) == b"{"
        proc.stdout.close()  # as `| head -c 1` does
        code = proc.wait(timeout=300)
        err = proc.stderr.read().decode("utf-8", errors="replace")
    assert code == 141, err
    assert "Traceback" not in err and "error" not in err, err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- 7. nothing left
@pytest.mark.parametrize(
    "args, what, shown, fix",
    [
        (["\u200b"], "the text", r"'\u200b'", "give a text with words in it."),
        (["\x01\x02"], "the text", r"'\x01\x02'", "give a text with words in it."),
        (
            ["hi", "--pair", "\u200b\u200b"],
            "--pair",
            r"'\u200b\u200b'",
            "give a second text with words in it, or drop --pair.",
        ),
    ],
)
def test_text_the_tokenizer_drops_entirely_is_refused(cli, tmp_path, args, what, shown, fix):
    r = cli("attend", *args, "--json", "a.json", cwd=tmp_path)
    _refused(
        r,
        2,
        f"{what} has no token the model knows (only [CLS] and [SEP] remain): {shown} holds "
        f"only characters the tokenizer drops (control, format or zero-width characters); {fix}",
    )
    assert r.out == ""
    assert list(tmp_path.iterdir()) == []


def test_text_from_file_the_tokenizer_drops_is_refused(cli, tmp_path):
    (tmp_path / "t.txt").write_text("\u200b\u200c\n", encoding="utf-8")
    r = cli("attend", "--file", "t.txt", "--png", "a.png", cwd=tmp_path)
    _refused(r, 2, "the text has no token the model knows (only [CLS] and [SEP] remain)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


def test_a_text_file_over_the_line_limit_is_refused_not_read_on(tmp_path):
    """``attend --file`` reads at most 64 MiB (and one byte, to know it is longer): a larger
    file (or ``/dev/zero``, which never ends) is refused, naming it, instead of held whole."""
    from bertattn.corpus.lines import MAX_LINE
    from bertattn.jobs.attend import read_text
    from bertattn.jobs.attend_options import AttendOptions

    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(MAX_LINE + 10)  # zeros, no line end; sparse, so cheap to make
    with pytest.raises(ValueError, match=r"big\.txt: longer than 64 MiB, the most attend reads"):
        read_text(AttendOptions(file=str(big)))
    fits = tmp_path / "fits.txt"
    fits.write_text("a short text\n")
    assert read_text(AttendOptions(file=str(fits))) == "a short text"
