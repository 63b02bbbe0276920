"""Byte-level BPE and the vocabulary rules every tokenizer shares, on crafted and real vocabularies:
merges, pre-tokenizers, token texts that are not UTF-8, end of generation, special tokens, errors."""

from __future__ import annotations

import logging

import gguf
import pytest
from vocab_cases import copy_vocab, tiny_bpe, vocab_path, write_vocab

from cooktop import Llama
from cooktop.errors import CooktopError, GGUFError, UnsupportedModelError
from cooktop.format.gguf import read_raw_metadata
from cooktop.text.base import clean_up_spaces
from cooktop.text.pretokenize import PRE_TYPES, PreTokenizer, pre_type
from cooktop.text.tokenizer import (
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_USER_DEFINED,
    Tokenizer,
)

ARRAY, STRING, UINT32, BOOL = (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32,
                               gguf.GGUFValueType.BOOL)


def ids_of(tok, *texts):
    return [tok.vocab.texts.index(t.encode() if isinstance(t, str) else t) for t in texts]


# --- merges and pre-tokenizer flags ----------------------------------------------------------


def test_merge_rank_order(tmp_path):
    """The pair with the lowest rank merges first, whatever its position."""
    extra = [("ab", 1), ("bc", 1)]
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "a.gguf", extra=extra, merges=["b c", "a b"]))
    assert t.tokenize("abc", add_bos=False) == ids_of(t, "a", "bc")
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "b.gguf", extra=extra, merges=["a b", "b c"]))
    assert t.tokenize("abc", add_bos=False) == ids_of(t, "ab", "c")
    # equal pairs: leftmost first ("aaa" -> "aa" + "a")
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "c.gguf", extra=[("aa", 1)], merges=["a a"]))
    assert t.tokenize("aaa", add_bos=False) == ids_of(t, "aa", "a")


def test_ignore_merges(tmp_path):
    """Llama 3 (``ignore_merges``): a word that is a token is taken whole; GPT-2 merges it."""
    extra = [("ab", 1), ("abc", 1)]
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "g.gguf", pre="gpt-2", extra=extra, merges=["a b"]))
    assert t.tokenize("abc", add_bos=False) == ids_of(t, "ab", "c")
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "l.gguf", pre="llama-bpe", extra=extra + [("<|begin_of_text|>", 3)],
                                     merges=["a b"], kv={"tokenizer.ggml.bos_token_id": (UINT32, 258)}))
    assert t.vocab.ignore_merges and t.vocab.add_bos
    assert t.tokenize("abc", add_bos=False) == ids_of(t, "abc")
    assert t.tokenize("abc", add_bos=True) == [258] + ids_of(t, "abc")


def test_add_bos_from_the_file_wins(tmp_path):
    kv = {"tokenizer.ggml.bos_token_id": (UINT32, 256), "tokenizer.ggml.add_bos_token": (BOOL, False)}
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "a.gguf", pre="llama-bpe", extra=[("<s>", 3)], kv=kv))
    assert not t.vocab.add_bos and t.tokenize("a", add_bos=True) == ids_of(t, "a")


# --- token texts that are not UTF-8 ---------------------------------------------------------


def test_bpe_token_text_not_utf8(tmp_path):
    """A USER_DEFINED token whose text is not UTF-8 loads, is split out of the input by its bytes
    and detokenizes to them; a NORMAL one prints as llama.cpp's ``[UNK_BYTE_...]``."""
    odd, normal_odd = b"\xff\xfe!", b"\x80zz"
    p = tiny_bpe(tmp_path / "odd.gguf", extra=[(odd, TOKEN_TYPE_USER_DEFINED), (normal_odd, TOKEN_TYPE_NORMAL)])
    for tok in (Tokenizer.from_gguf(p), Llama(model_path=str(p), vocab_only=True, verbose=False)):
        ids = tok.tokenize(b"hi\xff\xfe!there", add_bos=False, special=False)
        assert 256 in ids
        assert tok.detokenize(ids) == b"hi\xff\xfe!there"
    t = Tokenizer.from_gguf(p)
    assert t.vocab.texts[256] == odd and t.vocab.tokens[256].encode("utf-8", "surrogateescape") == odd
    assert t.token_to_piece(256) == odd
    assert t.token_to_piece(257) == b"[UNK_BYTE_0xefbfbd\x80zz]zz"


def test_spm_token_text_not_utf8(tmp_path):
    """An SPM token made of bytes that are not UTF-8 is merged from those bytes and prints them."""
    tokens = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % b for b in range(256)] + ["\u2581".encode(), b"a",
                                                                                    b"\x80\x81"]
    p = write_vocab(tmp_path / "spm.gguf", {
        "tokenizer.ggml.model": (STRING, "llama"),
        "tokenizer.ggml.tokens": (ARRAY, tokens),
        "tokenizer.ggml.scores": (ARRAY, [0.0] * 259 + [-1.0, -1.0, -0.5]),
        "tokenizer.ggml.token_type": (ARRAY, [2, 3, 3] + [6] * 256 + [1, 1, 1]),
        "general.name": (STRING, b"caf\xe9 (Latin-1)"),
    })
    t = Tokenizer.from_gguf(p)
    assert t.vocab.name == "caf\ufffd (latin-1)"  # a display string: decoded with replacement
    ids = t.tokenize(b"a\x80\x81", add_bos=False)
    assert ids == [259, 260, 261]
    assert t.detokenize_llama(ids) == b"a\x80\x81" and t.token_to_piece(261) == b"\x80\x81"
    assert t.tokenize(b"a\x80", add_bos=False) == [259, 260, 3 + 0x80]  # no token: byte fallback
    llm = Llama(model_path=str(p), vocab_only=True, verbose=False)
    assert llm.tokenize(b"a\x80\x81", add_bos=True) == [1, 259, 260, 261]
    assert llm.detokenize([1, 259, 260, 261]) == b"a\x80\x81"


# --- errors -----------------------------------------------------------------------------------


def test_unknown_pre_tokenizer_is_an_error(tmp_path):
    p = tiny_bpe(tmp_path / "u.gguf", pre="no-such-pre")
    with pytest.raises(UnsupportedModelError, match="unknown pre-tokenizer type 'no-such-pre'.*qwen2"):
        Tokenizer.from_gguf(p)
    with pytest.raises(UnsupportedModelError, match="'no-such-pre'"):
        Llama(model_path=str(p), vocab_only=True, verbose=False)
    with pytest.raises(UnsupportedModelError, match="'nope'"):
        pre_type("nope")


def test_missing_pre_tokenizer_uses_default_loudly(tmp_path, caplog):
    """llama.cpp's choice (with its warning): no tokenizer.ggml.pre means 'default'."""
    with caplog.at_level(logging.WARNING, logger="cooktop"):
        t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "n.gguf", pre=None))
    assert t.vocab.pre == "default"
    assert "missing tokenizer.ggml.pre" in caplog.text


def test_bpe_without_merges_is_an_error(tmp_path):
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.merges"):
        Tokenizer.from_gguf(tiny_bpe(tmp_path / "m.gguf", merges=None))


def test_duplicate_token_is_an_error(tmp_path):
    with pytest.raises(UnsupportedModelError, match="duplicate token.*ids 33 and 256"):
        Tokenizer.from_gguf(tiny_bpe(tmp_path / "d.gguf", extra=[("!", 1)]))


def test_truncated_vocabulary_is_a_gguf_error(tmp_path):
    p = tiny_bpe(tmp_path / "t.gguf", extra=[("x" * 50, 1)])
    data = p.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:data.index(b"x" * 50) + 10])
    with pytest.raises(GGUFError, match="ends inside metadata key 'tokenizer.ggml.tokens'"):
        Tokenizer.from_gguf(cut)


def test_vocab_only_llama_has_no_weights(tmp_path):
    llm = Llama(model_path=str(tiny_bpe(tmp_path / "v.gguf")), vocab_only=True, verbose=False)
    assert llm.n_vocab() == 256
    for call in (lambda: llm.eval([1]), lambda: llm.create_completion("hi")):
        with pytest.raises(CooktopError, match="loaded with vocab_only=True"):
            call()
    assert llm.metadata["tokenizer.ggml.model"] == "gpt2"
    llm.close()


def test_sources(tmp_path):
    """A path, a GGUFFile or a gguf.GGUFReader: the same vocabulary."""
    from cooktop.format.gguf import open_gguf

    p = tiny_bpe(tmp_path / "s.gguf", extra=[("ab", 1)])
    want = Tokenizer.from_gguf(str(p)).tokenize("abab a", add_bos=False)
    assert want == ids_of(Tokenizer.from_gguf(p), "ab", "ab", "Ġ", "a")
    assert Tokenizer.from_gguf(open_gguf(p)).tokenize("abab a", add_bos=False) == want
    assert Tokenizer.from_gguf(gguf.GGUFReader(p)).tokenize("abab a", add_bos=False) == want
    with pytest.raises(TypeError, match="GGUF path"):
        Tokenizer.from_gguf(42)


def test_raw_metadata_keeps_bytes(tmp_path):
    p = tiny_bpe(tmp_path / "r.gguf", extra=[(b"\xff", 4)], kv={"general.name": (STRING, b"x\xe9")})
    md = read_raw_metadata(p)
    assert md["general.name"].value == b"x\xe9"
    assert md["tokenizer.ggml.tokens"].value[256] == b"\xff" and len(md["tokenizer.ggml.tokens"].value) == 257
    assert md["tokenizer.ggml.token_type"].value.dtype.str == "<i4"
    assert set(read_raw_metadata(p, ["general.name", "no.such.key"])) == {"general.name"}


# --- end of generation, special tokens ----------------------------------------------------------


def test_end_of_generation_rules(tmp_path):
    """llama.cpp's load(): end-of-turn texts end generation and become CONTROL whatever the file says;
    FIM pad/repo/file-separator tokens found by text end generation; gpt-oss tokens are always printed."""
    extra = [("<|endoftext|>", 3), ("<|eot_id|>", 1), ("<|im_end|>", 3), ("<end_of_turn>", 4), ("<|end|>", 1),
             ("<|fim_pad|>", 3), ("<|fim_prefix|>", 1), ("<|im_start|>", 3), ("<|channel|>", 3), ("<|eom_id|>", 1)]
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "e.gguf", extra=extra,
                                     kv={"tokenizer.ggml.eos_token_id": (UINT32, 256)}))
    i = dict(zip([e[0] for e in extra], range(256, 256 + len(extra))))
    assert t.eog_ids == {i[k] for k in ("<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>",
                                        "<|fim_pad|>", "<|eom_id|>")}
    assert not t.is_eog(i["<|im_start|>"]) and not t.is_eog(i["<|fim_prefix|>"])
    for k in ("<|eot_id|>", "<end_of_turn>", "<|end|>", "<|fim_prefix|>", "<|eom_id|>"):
        assert t.token_type(i[k]) == TOKEN_TYPE_CONTROL, k
    assert t.token_type(i["<|channel|>"]) == TOKEN_TYPE_USER_DEFINED
    assert t.special_ids["eot"] == i["<|eot_id|>"] and t.special_ids["fim_pad"] == i["<|fim_pad|>"]
    # CONTROL: parsed only with special, printed only with special
    assert t.tokenize("<|eot_id|>", add_bos=False, special=True) == [i["<|eot_id|>"]]
    assert i["<|eot_id|>"] not in t.tokenize("<|eot_id|>", add_bos=False, special=False)
    assert t.token_to_piece(i["<|eot_id|>"]) == b"" and t.token_to_piece(i["<|eot_id|>"], special=True) == b"<|eot_id|>"
    # USER_DEFINED: always parsed, always printed
    assert t.tokenize("a<|channel|>", add_bos=False) == ids_of(t, "a") + [i["<|channel|>"]]
    assert t.detokenize([i["<|channel|>"]]) == b"<|channel|>"


def test_end_of_generation_exceptions(tmp_path):
    """o200k_harmony: with <|return|> and <|call|>, <|end|> is not EOG; gemma4: </s> is normal."""
    extra = [("<|end|>", 3), ("<|return|>", 3), ("<|call|>", 3), ("</s>", 3), ("<|tool_response>", 3)]
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "x.gguf", extra=extra))
    assert t.eog_ids == {11, 257, 258, 260}  # 11: llama.cpp's default BPE EOS when the file names none
    assert t.token_type(256) == TOKEN_TYPE_USER_DEFINED and t.token_type(259) == TOKEN_TYPE_NORMAL
    # a FIM pad id set in the file replaces the one found by text
    t = Tokenizer.from_gguf(tiny_bpe(tmp_path / "f.gguf", extra=[("<|fim_pad|>", 1), ("<pad>", 3)],
                                     kv={"tokenizer.ggml.fim_pad_token_id": (UINT32, 257)}))
    assert t.eog_ids == {11, 257} and t.token_type(256) == TOKEN_TYPE_NORMAL


def test_real_vocab_eog_and_special_pieces(shared):
    t = Tokenizer.from_gguf(vocab_path(shared, "llama-bpe"))
    assert t.eog_ids == {128001, 128009}  # <|end_of_text|>, <|eot_id|>
    q = Tokenizer.from_gguf(vocab_path(shared, "qwen2"))
    assert q.eog_ids == {151643, 151645, 128247}  # <|endoftext|>, <|im_end|> and a NORMAL "</s>" made CONTROL
    assert q.token_type(128247) == TOKEN_TYPE_CONTROL
    text = "<|im_start|>user\nhi<|im_end|>\n"
    ids = q.tokenize(text, add_bos=False, special=True)
    assert ids[0] == 151644 and 151645 in ids
    assert q.detokenize(ids) == b"user\nhi\n"
    assert q.detokenize(ids, special=True) == text.encode()
    plain = q.tokenize(text, add_bos=False, special=False)
    assert 151644 not in plain and q.detokenize(plain) == text.encode()
    s = Tokenizer.from_gguf(vocab_path(shared, "starcoder"))
    assert s.eog_ids == {0, 4}  # <|endoftext|>, <fim_pad>


def test_clean_spaces(shared):
    """llama_detokenize removes spaces before punctuation and contractions where the vocabulary says so."""
    text = "Hello , world ! it 's fine . I 'm sure you 'll see they 're here"
    t = Tokenizer.from_gguf(vocab_path(shared, "llama-bpe"))
    ids = t.tokenize(text, add_bos=True)
    assert t.detokenize_llama(ids, remove_special=True) == b"Hello, world! it's fine. I'm sure you 'll see they're here"
    assert t.detokenize(ids) == text.encode()  # llama-cpp-python's detokenize does not clean
    q = Tokenizer.from_gguf(vocab_path(shared, "qwen2"))
    assert q.detokenize_llama(q.tokenize(text, add_bos=False)) == text.encode()
    assert clean_up_spaces(b"a ' b") == b"a'b"
    assert clean_up_spaces(b" ?x ' ' y") == b"?x'' y"
    assert clean_up_spaces(b"don 't , we 've") == b"don 't, we've"


# --- pre-tokenizers -----------------------------------------------------------------------------


def test_pre_tokenizer_names():
    wanted = {"default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "smollm", "starcoder", "refact", "deepseek-llm",
              "deepseek-coder", "deepseek-v3", "falcon", "mpt", "command-r", "gpt-4o", "tekken"}
    assert wanted <= set(PRE_TYPES)


@pytest.mark.parametrize("regexes,text,words", [
    ("llama3", "12345 abc", ["123", "45", " abc"]),
    ("qwen2", "12345", ["1", "2", "3", "4", "5"]),
    ("qwen2", "e\u0301x", ["e", "\u0301x"]),
    ("qwen35", "e\u0301x e\u0301", ["e\u0301x", " e\u0301"]),  # letter runs take combining marks
    ("gpt2", "don't  stop\n", ["don", "'t", " ", " stop", "\n"]),
    ("gpt-4o", " CamelCase's", [" Camel", "Case's"]),
    ("deepseek-coder", "x\n中文12", ["x", "\n", "中文", "1", "2"]),
    ("llama3", "a\u3000\u3000b", ["a", "\u3000", "\u3000b"]),  # ideographic space is whitespace in llama.cpp's table
])
def test_pre_tokenizer_splits(regexes, text, words):
    assert PreTokenizer(regexes).split(text) == words


def test_copy_vocab_helper(shared, tmp_path):
    """The test helper that rewrites a vocabulary keeps it intact (the llama.cpp comparisons rely on it)."""
    p = copy_vocab(vocab_path(shared, "gpt-2"), tmp_path / "g.gguf", tokenizer__ggml__pre=(STRING, "falcon"))
    t = Tokenizer.from_gguf(p)
    assert t.vocab.pre == "falcon" and t.n_vocab == 50257 and len(t.vocab.merges) == 50000
