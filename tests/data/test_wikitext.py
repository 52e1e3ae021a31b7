"""WikiText reader: fairseq's dictionary and end-of-line rule on files in the exact WikiText format, and errors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from primaldual.data.cache import MissingDataError
from primaldual.data.wikitext import (
    EOS,
    UNK,
    WordDictionary,
    find_wikitext_files,
    load_wikitext,
    read_lines,
    tokenize_line,
)

# The layout of wiki.*.tokens: a leading " " line, " = Title = " headings, " @-@ " / " @,@ " tokens, blank lines
# made of one space, <unk> already in the text, every line ending with " \n".
TRAIN = (
    " \n"
    " = Valkyria Chronicles III = \n"
    " \n"
    " Senjō no Valkyria 3 : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア3 ) is a tactical role @-@ playing "
    "video game . \n"
    " \n"
    " = = Gameplay = = \n"
    " \n"
    " The game sold 1 @,@ 000 copies , and the game was a success . \n"
)
VALID = " \n = Tower Building = \n \n The game was a tactical building . \n"
TEST = " = Robert Boulter = \n \n Boulter starred in the play . \n"


def write(root, train=TRAIN, valid=VALID, test=TEST, newline="\n"):
    root.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        if text is not None:
            data = text.replace("\n", newline).encode("utf-8") if isinstance(text, str) else text
            (root / f"wiki.{name}.tokens").write_bytes(data)
    return root


def test_tokenize_line_is_fairseqs():
    assert tokenize_line(" = = Gameplay = = \n") == ["=", "=", "Gameplay", "=", "="]
    assert tokenize_line(" \n") == [] and tokenize_line("") == []
    assert tokenize_line("a\tb\u00a0c  d\x0be") == ["a", "b", "c", "d", "e"]  # Unicode whitespace separates


def test_dictionary_order_eos_per_line_and_padding(tmp_path):
    wt = load_wikitext(write(tmp_path))
    d = wt.dictionary
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    lines = TRAIN.split("\n")[:-1]
    assert len(lines) == 8  # 4 of them blank: each still yields a </s>
    words = Counter(w for line in lines for w in line.split())
    assert d.counts[d.eos_index] == 8 and d.counts[d.unk_index] == words["<unk>"] == 1
    body = [s for s in d.symbols[4:] if not s.startswith("madeupword")]
    # every train word once, by decreasing count, ties in code-point order ("." < "=" < "@,@" < "Chronicles" < ...)
    expected = sorted((w for w in words if w != UNK), key=lambda w: (-words[w], w))
    assert body == expected and body[:3] == ["=", "game", "."]
    assert len(d) % 8 == 0 and d.symbols[-1].startswith("madeupword") and d.symbols[4 + len(body)] == "madeupword0000"
    assert len(load_wikitext(tmp_path, padding_factor=1).dictionary) == 4 + len(body)
    # the stream: words + </s> for every line, blank lines as a lone </s>
    train = wt.tokens["train"]
    assert train.dtype == np.int32 and len(train) == sum(len(line.split()) + 1 for line in lines)
    assert train[0] == d.eos_index and train[1:6].tolist() == [
        d.index(w) for w in ["=", "Valkyria", "Chronicles", "III", "="]
    ]
    assert d.string(train).split("\n") == [" ".join(line.split()) for line in lines]
    assert (train == d.unk_index).sum() == 1 and 3 not in d.encode_line("Senjō no")


def test_unseen_words_map_to_unk(tmp_path):
    wt = load_wikitext(write(tmp_path))
    d = wt.dictionary
    valid = wt.tokens["valid"]
    assert d.string(valid).split("\n") == ["", "= <unk> <unk> =", "", "The game was a tactical <unk> ."]
    assert wt.info["unk_tokens"]["valid"] == 3 and wt.info["tokens"]["test"] == (4 + 1) + 1 + (6 + 1)
    assert d.encode_line("Tower game") == [d.unk_index, d.index("game"), d.eos_index]


def test_crlf_files_read_like_lf(tmp_path):
    a = load_wikitext(write(tmp_path / "lf"))
    b = load_wikitext(write(tmp_path / "crlf", newline="\r\n"))
    assert a.dictionary.symbols == b.dictionary.symbols
    assert all(np.array_equal(a.tokens[s], b.tokens[s]) for s in a.tokens)


def test_dictionary_save_load_round_trip(tmp_path):
    d = load_wikitext(write(tmp_path / "wt")).dictionary
    path = d.save(tmp_path / "dict.txt")
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == "= 6"  # fairseq's dict.txt: "<word> <count>", specials omitted
    e = WordDictionary.load(path)
    assert e.symbols == d.symbols and e.counts[4:] == d.counts[4:]
    (tmp_path / "bad.txt").write_text("oneword\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        WordDictionary.load(tmp_path / "bad.txt")


def test_missing_split_is_one_line_with_the_stand_in(tmp_path):
    write(tmp_path, valid=None)
    with pytest.raises(MissingDataError) as e:
        load_wikitext(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "wiki.valid.tokens" in msg and "primaldual data fetch english" in msg
    assert "Salesforce" in msg
    assert load_wikitext(tmp_path, splits=["train", "test"]).tokens.keys() == {"train", "test"}
    with pytest.raises(MissingDataError, match="wiki.train.tokens"):
        load_wikitext(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="splits"):
        find_wikitext_files(tmp_path, ["dev"])


def test_subfolder_layout(tmp_path):
    write(tmp_path / "wikitext-2")
    assert find_wikitext_files(tmp_path)["train"] == tmp_path / "wikitext-2" / "wiki.train.tokens"


def test_malformed_files(tmp_path):
    write(tmp_path / "empty", train="")
    with pytest.raises(ValueError, match="no words"):
        load_wikitext(tmp_path / "empty")
    write(tmp_path / "blank", train=" \n \n\n")
    with pytest.raises(ValueError, match="no words"):
        load_wikitext(tmp_path / "blank")
    write(tmp_path / "latin1", valid=" = Caf\xe9 = \n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"wiki.valid.tokens:1: not UTF-8"):
        load_wikitext(tmp_path / "latin1")
    write(tmp_path / "binary", train=TRAIN.encode() + bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"wiki.train.tokens:9: not UTF-8|binary"):
        load_wikitext(tmp_path / "binary")
    write(tmp_path / "nul", test=b" a \x00 b \n")
    with pytest.raises(ValueError, match=r"wiki.test.tokens:1: NUL byte"):
        load_wikitext(tmp_path / "nul")
    assert list(read_lines(write(tmp_path / "ok") / "wiki.test.tokens"))[0] == " = Robert Boulter = "
    assert EOS == "</s>"
