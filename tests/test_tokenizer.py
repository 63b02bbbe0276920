"""The llama SPM tokenizer against llama.cpp: its test vectors, its reference generations, its rules."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time

import gguf
import numpy as np
import pytest

from cooktop.errors import CooktopError, UnsupportedModelError
from cooktop.text.tokenizer import (
    TOKEN_TYPE_BYTE,
    TOKEN_TYPE_USER_DEFINED,
    InvalidTokenError,
    Tokenizer,
    load_vocab,
)

# Same location rule as tests/conftest.py; only used to enumerate cases at collection time.
# Every test still requests the ``shared`` fixture, which skips (or fails under
# COOKTOP_REQUIRE=shared) when the data is absent.
_SHARED = pathlib.Path(os.environ.get("COOKTOP_SHARED", pathlib.Path(__file__).resolve().parents[2] / "shared"))
_SPM = "vocab/ggml-vocab-llama-spm.gguf"


def _read_vocab_tests(base: pathlib.Path) -> list[tuple[bytes, list[int]]]:
    """Cases of llama.cpp's ``.inp``/``.out`` pair, split as test-tokenizer-0.cpp does."""
    raw = pathlib.Path(str(base) + ".inp").read_bytes()
    sep = b"\n__ggml_vocab_test__\n"
    inp, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            inp.append(raw[pos:])
            break
        inp.append(raw[pos:nxt])
        pos = nxt + len(sep)
    out = pathlib.Path(str(base) + ".out").read_text().split("\n")
    if out and out[-1] == "":
        out.pop()
    assert len(inp) == len(out), f"{base}: {len(inp)} inputs, {len(out)} outputs"
    return [(s, [int(x) for x in o.split()]) for s, o in zip(inp, out)]


def _case_params():
    try:
        cases = _read_vocab_tests(_SHARED / _SPM)
    except OSError:
        return [pytest.param(None, id="no-vocab-data")]
    return [pytest.param(i, id=f"{i:02d}-{c[0][:24].decode('utf-8', 'replace')!r}") for i, c in enumerate(cases)]


def _reference_params():
    names = sorted(p.name for p in (_SHARED / "reference").glob("*.json")) if (_SHARED / "reference").is_dir() else []
    return names or [pytest.param(None, id="no-reference-data")]


@pytest.fixture(scope="module")
def spm(shared) -> Tokenizer:
    """The 32000-token Llama 1/2 vocabulary."""
    return Tokenizer.from_gguf(gguf.GGUFReader(shared / _SPM))


@pytest.fixture(scope="module")
def spm_cases(shared):
    return _read_vocab_tests(shared / _SPM)


@pytest.fixture(scope="module")
def stories_tok(stories) -> Tokenizer:
    """The 512-token llama2.c vocabulary of stories260K (and of the tiny-* models)."""
    return Tokenizer.from_gguf(gguf.GGUFReader(stories))


# --- llama.cpp test vectors ----------------------------------------------------------


@pytest.mark.parametrize("i", _case_params())
def test_llama_spm_vectors(spm, spm_cases, i):
    """Exactly llama.cpp's expected ids, without BOS and without special parsing."""
    if i is None:
        pytest.fail(f"{_SPM}.inp/.out not readable at collection time")
    text, expected = spm_cases[i]
    assert spm.tokenize(text, add_bos=False, special=False) == expected
    # str input is the same as its UTF-8 bytes
    assert spm.tokenize(text.decode("utf-8"), add_bos=False) == expected


@pytest.mark.parametrize("i", _case_params())
def test_llama_spm_roundtrip(spm, spm_cases, i):
    """llama_detokenize removes the space SPM added, so every case round-trips exactly."""
    if i is None:
        pytest.fail(f"{_SPM}.inp/.out not readable at collection time")
    text, expected = spm_cases[i]
    assert spm.detokenize_llama(expected) == text
    # the llama-cpp-python way: with BOS in front, the leading added space is dropped too
    with_bos = spm.tokenize(text, add_bos=True)
    assert with_bos == [spm.bos_id] + expected
    assert spm.detokenize(with_bos) == text


def test_vocab_fields(spm):
    v = spm.vocab
    assert spm.n_vocab == 32000 == len(v.tokens)
    assert v.scores.dtype == np.float32 and v.scores.shape == (32000,)
    assert v.token_types.dtype == np.int32 and v.token_types.shape == (32000,)
    assert (spm.bos_id, spm.eos_id, v.unk_id, v.pad_id) == (1, 2, 0, None)
    assert (v.add_bos, v.add_eos, v.add_space_prefix, v.model) == (True, False, True, "llama")
    assert v.tokens[:3] == ["<unk>", "<s>", "</s>"]


# --- llama.cpp reference generations ----------------------------------------------------


@pytest.mark.parametrize("name", _reference_params())
def test_reference_prompts_and_greedy_text(shared, name):
    """Prompt ids (with BOS) and the greedy text that llama-cpp-python produced."""
    if name is None:
        pytest.fail("no reference/*.json at collection time")
    ref = json.loads((shared / "reference" / name).read_text())
    model = shared / "models" / ref["model"]
    if not model.exists():
        model = shared / "models" / "tiny" / ref["model"]
    if not model.exists():
        model = shared / "models" / "stories260K.gguf"  # stories260K_ggmlorg.gguf is stored under this name
    tok = Tokenizer.from_gguf(gguf.GGUFReader(model))
    assert ref["cases"]
    for case in ref["cases"]:
        assert tok.tokenize(case["prompt"], add_bos=True) == case["prompt_tokens"]
        assert tok.detokenize(case["prompt_tokens"]) == case["prompt"].encode()
        text = tok.detokenize(case["greedy_tokens"])
        assert text.decode("utf-8", errors="replace") == case["greedy_text"]


def test_stories_prompt(stories_tok):
    assert stories_tok.tokenize("Once upon a time", add_bos=True) == [1, 403, 407, 261, 378]
    assert stories_tok.tokenize("Once upon a time", add_bos=False) == [403, 407, 261, 378]


# --- special tokens -------------------------------------------------------------------


def test_special_parsing(spm):
    text = "<s>Hello</s> world"
    got = spm.tokenize(text, add_bos=False, special=True)
    # llama.cpp: a space is prefixed after every special token, hence "▁" + "▁world"
    assert got == [1, 15043, 2, 29871, 3186]
    plain = spm.tokenize(text, add_bos=False, special=False)
    assert 1 not in plain and 2 not in plain
    assert spm.detokenize_llama(plain) == text.encode()
    # with BOS added as well, BOS appears twice (llama.cpp only warns)
    assert spm.tokenize("<s>Hi", add_bos=True, special=True)[:2] == [1, 1]


def test_special_parsing_stories(stories_tok):
    t = stories_tok
    ids = t.tokenize("a</s><s>b", add_bos=False, special=True)
    assert ids.count(t.eos_id) == 1 and ids.count(t.bos_id) == 1
    assert ids.index(t.eos_id) < ids.index(t.bos_id)
    assert t.eos_id not in t.tokenize("a</s><s>b", add_bos=False, special=False)


def test_user_defined_always_split(stories_tok):
    v = stories_tok.vocab
    ing = v.tokens.index("ing")
    types = v.token_types.copy()
    types[ing] = TOKEN_TYPE_USER_DEFINED
    t = Tokenizer(dataclasses.replace(v, token_types=types))
    assert t.tokenize("sing", add_bos=False) == t.tokenize("s", add_bos=False) + [ing]
    assert t.token_to_piece(ing) == b"ing"


def test_add_eos_and_space_prefix(stories_tok):
    v = stories_tok.vocab
    t = Tokenizer(dataclasses.replace(v, add_eos=True))
    assert t.tokenize("Once", add_bos=True) == [1, 403, 2]
    assert t.tokenize("Once", add_bos=False) == [403]
    t = Tokenizer(dataclasses.replace(v, add_bos=False))
    assert t.tokenize("Once", add_bos=True) == [403]
    t = Tokenizer(dataclasses.replace(v, add_space_prefix=False))
    ids = t.tokenize("Once", add_bos=False)
    assert ids != [403] and t.detokenize(ids) == b"Once"
    assert stories_tok.tokenize("", add_bos=True) == [1]
    assert stories_tok.tokenize("", add_bos=False) == []


# --- pieces and byte fallback -------------------------------------------------------------


def test_token_to_piece(stories_tok):
    t = stories_tok
    assert t.token_to_piece(t.bos_id) == b"" and t.token_to_piece(t.bos_id, special=True) == b"<s>"
    assert t.token_to_piece(t.eos_id) == b"" and t.token_to_piece(t.eos_id, special=True) == b"</s>"
    assert t.token_to_piece(0) == b"" and t.token_to_piece(0, special=True) == b"<unk>"
    assert t.token_to_piece(403) == b" Once"          # "▁Once"
    assert t.token_to_piece(3 + 0x41) == b"A"         # <0x41>
    assert t.token_to_piece(3 + 0xE2) == b"\xe2"
    assert t.detokenize([1, 403, 2], special=True) == b"<s> Once</s>"
    with pytest.raises(InvalidTokenError, match="out of range"):
        t.token_to_piece(512)
    with pytest.raises(CooktopError):
        t.detokenize([1, -1])


@pytest.mark.parametrize("text", ["£", "🦙", "a中b 🦙🦙", "naïve ☃ Ω"])
def test_byte_fallback(stories_tok, text):
    t = stories_tok
    ids = t.tokenize(text, add_bos=False)
    types = t.vocab.token_types
    missing = {c for c in text if c != " " and c not in t.vocab.tokens}
    assert missing, "test text should contain characters outside the 512-token vocab"
    for c in missing:
        # each missing character appears as its UTF-8 bytes in <0xNN> tokens
        seq = [t.vocab.tokens.index(f"<0x{b:02X}>") for b in c.encode()]
        assert all(types[i] == TOKEN_TYPE_BYTE for i in seq)
        assert any(ids[k:k + len(seq)] == seq for k in range(len(ids)))
    assert t.detokenize_llama(ids) == text.encode()
    assert t.detokenize([t.bos_id] + ids) == text.encode()


def test_byte_fallback_exact(stories_tok):
    t = stories_tok
    assert "€" in t.vocab.tokens  # this small vocab does hold the euro sign as one token
    assert t.tokenize("€", add_bos=False) == [t.vocab.tokens.index("\u2581"), t.vocab.tokens.index("€")]
    pound = [t.vocab.tokens.index(f"<0x{b:02X}>") for b in "£".encode()]
    ids = t.tokenize("£", add_bos=False)
    assert ids == [t.vocab.tokens.index("\u2581")] + pound
    assert t.detokenize(ids) == " £".encode() and t.detokenize([1] + ids) == "£".encode()


def test_invalid_utf8_bytes(stories_tok):
    t = stories_tok
    raw = b"a\x80b\xc3"  # stray continuation byte, truncated sequence at the end
    ids = t.tokenize(raw, add_bos=False)
    assert t.detokenize_llama(ids) == raw
    assert ids[-1] == t.vocab.tokens.index("<0xC3>")
    # llama.cpp takes a character's length from its lead byte (0xFF -> 4 bytes), so an
    # invalid lead byte swallows what follows, the escaped space included
    ids = t.tokenize(b"\xff c", add_bos=False)
    assert t.detokenize_llama(ids) == b"\xff\xe2\x96\x81c"


def test_is_eog(spm):
    assert spm.is_eog(2)
    assert not spm.is_eog(1) and not spm.is_eog(15043)


# --- errors -------------------------------------------------------------------------------


def test_unsupported_tokenizer_model_rejected(tmp_path):
    """A tokenizer model cooktop does not have is named in the error (gpt2 is supported since BPE landed)."""
    r = _write_gguf(tmp_path / "bert.gguf", {
        "tokenizer.ggml.model": ("string", "bert"),
        "tokenizer.ggml.tokens": ("array", ["[PAD]", "[UNK]", "a"]),
    })
    with pytest.raises(UnsupportedModelError, match="tokenizer model 'bert' is not supported"):
        load_vocab(r)
    with pytest.raises(UnsupportedModelError, match="'bert'"):
        Tokenizer.from_gguf(r)


def _write_gguf(path: pathlib.Path, kv: dict) -> gguf.GGUFReader:
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (kind, value) in kv.items():
        getattr(w, f"add_{kind}")(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf.GGUFReader(str(path))


def test_missing_keys_rejected(tmp_path):
    r = _write_gguf(tmp_path / "a.gguf", {})
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.model"):
        load_vocab(r)
    r = _write_gguf(tmp_path / "b.gguf", {"tokenizer.ggml.model": ("string", "llama")})
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.tokens"):
        load_vocab(r)
    r = _write_gguf(tmp_path / "c.gguf", {
        "tokenizer.ggml.model": ("string", "llama"),
        "tokenizer.ggml.tokens": ("array", ["<unk>", "<s>", "</s>", "a"]),
        "tokenizer.ggml.scores": ("array", [0.0, 0.0]),
    })
    with pytest.raises(UnsupportedModelError, match="scores"):
        load_vocab(r)


def test_minimal_vocab_defaults(tmp_path):
    """A vocab without scores/types/ids: llama.cpp's SPM defaults; no byte tokens -> UNK."""
    r = _write_gguf(tmp_path / "m.gguf", {
        "tokenizer.ggml.model": ("string", "llama"),
        "tokenizer.ggml.tokens": ("array", ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "ab", "\u2581ab"]),
        "tokenizer.ggml.scores": ("array", [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -0.5]),
    })
    t = Tokenizer.from_gguf(r)
    assert (t.bos_id, t.eos_id, t.vocab.unk_id) == (1, 2, 0)
    assert t.tokenize("ab", add_bos=True) == [1, 7]
    assert t.tokenize("abz", add_bos=False) == [7, 0]  # "z": no <0x7A> and no "z" token -> UNK


def test_merge_priority_and_ties(tmp_path):
    """Highest score merges first; equal scores merge leftmost first."""
    toks = ["<unk>", "<s>", "</s>", "\u2581", "a", "aa", "\u2581a"]
    r = _write_gguf(tmp_path / "t.gguf", {
        "tokenizer.ggml.model": ("string", "llama"),
        "tokenizer.ggml.tokens": ("array", toks),
        "tokenizer.ggml.scores": ("array", [0.0, 0.0, 0.0, -5.0, -5.0, -1.0, -1.0]),
        "tokenizer.ggml.add_space_prefix": ("bool", False),
    })
    t = Tokenizer.from_gguf(r)
    # "aaa": pairs (0,1) and (1,2) tie on "aa" -> leftmost merges -> "aa" + "a"
    assert t.tokenize("aaa", add_bos=False) == [5, 4]
    # " aa": "▁a" (-1.0, left 0) and "aa" (-1.0, left 1) tie -> leftmost "▁a" then "a"
    assert t.tokenize(" aa", add_bos=False) == [6, 4]


# --- speed --------------------------------------------------------------------------------


def test_long_inputs_finish(spm, spm_cases):
    """Hang guard, not a speed measurement (that is `cooktop bench`'s job): 10 KB inputs,
    including the merge queue's worst case, finish far inside a generous bound that only
    an O(n^2) or looping merge would miss."""
    text = b"".join(s for s, _ in spm_cases)
    text = (text * (10_000 // len(text) + 1))[:10_000]
    spm.tokenize(text[:100])
    t0 = time.perf_counter()
    ids = spm.tokenize(text, add_bos=False)
    dt = time.perf_counter() - t0
    assert len(ids) > 1000
    assert dt < 30.0, f"tokenizing 10 KB took {dt:.3f} s"
    # a long run of one character (worst case for the merge queue) stays fast too
    t0 = time.perf_counter()
    ids = spm.tokenize("a" * 10_000, add_bos=False)
    assert spm.detokenize(ids) == b" " + b"a" * 10_000 or spm.detokenize(ids).endswith(b"a" * 10_000)
    assert time.perf_counter() - t0 < 30.0


def test_control_looking_tokens(stories_tok):
    """llama.cpp forces end-of-turn texts to CONTROL and ends generation on them."""
    v = stories_tok.vocab
    ing = v.tokens.index("ing")
    tokens = list(v.tokens)
    tokens[ing] = "<|im_end|>"  # typed NORMAL in this vocab
    t = Tokenizer(dataclasses.replace(v, tokens=tokens))
    assert t.is_eog(ing) and t.is_eog(t.eos_id) and not t.is_eog(t.bos_id)
    assert t.token_to_piece(ing) == b"" and t.token_to_piece(ing, special=True) == b"<|im_end|>"
    assert t.tokenize("hi<|im_end|>", add_bos=False, special=True)[-1] == ing
    assert ing not in t.tokenize("hi<|im_end|>", add_bos=False, special=False)


def test_corrupt_byte_token_rejected(stories_tok):
    """A BYTE token whose text is not <0xNN> is a corrupt vocabulary: a clear error, not a traceback."""
    v = stories_tok.vocab if hasattr(stories_tok, "vocab") else stories_tok._vocab
    tokens = list(v.tokens)
    byte_id = int(np.flatnonzero(v.token_types == 6)[0])
    tokens[byte_id] = "<0xZZ>"
    with pytest.raises(UnsupportedModelError, match=r"byte token .*<0xZZ>.*corrupt"):
        Tokenizer(dataclasses.replace(v, tokens=tokens))
