"""llama.cpp's tokenizer test vectors for every vocabulary in ../shared/vocab (SPM and byte-level BPE),
directly and through ``Llama(vocab_only=True)``, and tokenize/detokenize round trips on random input."""

from __future__ import annotations

import random
import zlib

import pytest
from vocab_cases import BPE_VOCABS, SHARED, VOCABS, random_bytes, random_text, read_vocab_tests, vocab_path

from cooktop import Llama
from cooktop.text.base import clean_up_spaces
from cooktop.text.bpe import BYTE_TO_UNICODE
from cooktop.text.pretokenize import utf8_codepoints
from cooktop.text.tokenizer import BpeTokenizer, SpmTokenizer, Tokenizer

_TOKENIZERS: dict[str, Tokenizer] = {}
_LLAMAS: dict[str, Llama] = {}


def _case_params():
    params = []
    for name in VOCABS:
        try:
            n = len(read_vocab_tests(vocab_path(SHARED, name)))
        except OSError:
            params.append(pytest.param(name, None, id=f"{name}-no-vocab-data"))
            continue
        params += [pytest.param(name, i, id=f"{name}-{i:02d}") for i in range(n)]
    return params


def tokenizer(shared, name: str) -> Tokenizer:
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = Tokenizer.from_gguf(vocab_path(shared, name))
    return _TOKENIZERS[name]


def llama(shared, name: str) -> Llama:
    if name not in _LLAMAS:
        _LLAMAS[name] = Llama(model_path=str(vocab_path(shared, name)), vocab_only=True, verbose=False)
    return _LLAMAS[name]


@pytest.fixture(scope="module")
def cases(shared):
    return {name: read_vocab_tests(vocab_path(shared, name)) for name in VOCABS}


@pytest.mark.parametrize("name,i", _case_params())
def test_vectors(shared, cases, name, i):
    """Exactly llama.cpp's expected ids, without BOS and without special parsing."""
    if i is None:
        pytest.fail(f"{name}: .inp/.out not readable at collection time")
    text, expected = cases[name][i]
    tok = tokenizer(shared, name)
    assert tok.tokenize(text, add_bos=False, special=False) == expected
    assert tok.tokenize(text.decode("utf-8"), add_bos=False) == expected


@pytest.mark.parametrize("name,i", _case_params())
def test_vectors_public_api(shared, cases, name, i):
    """The same through ``Llama(model_path=<vocab gguf>, vocab_only=True)``, and back."""
    if i is None:
        pytest.fail(f"{name}: .inp/.out not readable at collection time")
    text, expected = cases[name][i]
    llm = llama(shared, name)
    assert llm.tokenize(text, add_bos=False, special=False) == expected
    if name == "llama-spm":  # llama-cpp-python drops the space SPM adds when the ids start with BOS
        assert llm.detokenize([llm.token_bos()] + expected) == text
    else:
        assert llm.detokenize(expected) == text


def test_tokenizer_types_and_flags(shared):
    """Each vocabulary gets its tokenizer and llama.cpp's per-pre-tokenizer settings."""
    assert isinstance(tokenizer(shared, "llama-spm"), SpmTokenizer)
    q = tokenizer(shared, "qwen2")
    assert isinstance(q, BpeTokenizer) and isinstance(q, Tokenizer)
    v = q.vocab
    assert (v.model, v.pre, q.n_vocab, len(v.merges)) == ("gpt2", "qwen2", 151936, 151387)
    assert (v.add_bos, v.add_eos, v.clean_spaces, v.ignore_merges, v.add_space_prefix) == (False, False, False, False,
                                                                                           False)
    assert (q.bos_id, q.eos_id, v.pad_id) == (151643, 151643, 151643)
    v = tokenizer(shared, "llama-bpe").vocab
    # llama-bpe: add_bos, ignore_merges from the pre-tokenizer type (the file has no add_bos_token key)
    assert (v.pre, v.add_bos, v.clean_spaces, v.ignore_merges) == ("llama-bpe", True, True, True)
    v = tokenizer(shared, "gpt-2").vocab
    assert (v.pre, v.add_bos, v.clean_spaces, v.ignore_merges) == ("gpt-2", False, True, False)
    assert all(isinstance(t, bytes) for t in v.texts[:100]) and v.texts[0] == b"!"
    llm = llama(shared, "llama-bpe")
    assert (llm.n_vocab(), llm.token_bos(), llm.token_eos()) == (128256, 128000, 128001)
    assert llm.tokenize(b"Hello", add_bos=True)[0] == 128000


@pytest.mark.parametrize("name", BPE_VOCABS)
def test_round_trip_random_text(shared, name):
    """Byte-level BPE loses nothing: valid UTF-8 text comes back exactly, special texts included
    (except bytes the vocabulary has no token for, dropped as llama.cpp drops them)."""
    tok = tokenizer(shared, name)
    missing = {b for b in range(256) if BYTE_TO_UNICODE[b].encode() not in tok._to_id}
    assert missing == (set() if name != "starcoder" else {0xC0, 0xC1, 0xF1, *range(0xF5, 0x100)})
    rng = random.Random(zlib.crc32(name.encode()))
    for _ in range(300):
        text = random_text(rng).encode()
        kept = bytes(b for b in text if b not in missing)
        ids = tok.tokenize(text, add_bos=False)
        assert tok.detokenize(ids) == kept, (text, ids)
        # llama_detokenize: the same, but for llama.cpp's clean-up of spaces where the vocabulary asks for it
        assert tok.detokenize_llama(ids) == (clean_up_spaces(kept) if tok.vocab.clean_spaces else kept)
        ids = tok.tokenize(text, add_bos=False, special=True)
        assert tok.detokenize(ids, special=True) == kept, (text, ids)


@pytest.mark.parametrize("name", BPE_VOCABS)
def test_round_trip_random_bytes(shared, name):
    """Random bytes come back as llama.cpp reads them: each byte that is not part of a valid
    UTF-8 sequence as U+FFFD (llama.cpp ``unicode_cpts_from_utf8``); valid UTF-8 exactly."""
    tok = tokenizer(shared, name)
    missing = {b for b in range(256) if BYTE_TO_UNICODE[b].encode() not in tok._to_id}
    rng = random.Random(zlib.crc32(name.encode()))
    n_invalid = 0
    for _ in range(300):
        raw = random_bytes(rng)
        back = tok.detokenize(tok.tokenize(raw, add_bos=False))
        as_read = utf8_codepoints(raw).encode("utf-8", "surrogatepass")
        assert back == bytes(b for b in as_read if b not in missing), raw
        try:
            raw.decode("utf-8")
            assert as_read == raw
        except UnicodeDecodeError:
            n_invalid += 1
    assert n_invalid > 100


def test_invalid_utf8_input_is_replacement_character(shared):
    """An invalid byte tokenizes as U+FFFD, one per byte, as in llama.cpp; a lone surrogate's
    bytes (ED A0 80) pass through, since llama.cpp does not check for surrogates."""
    tok = tokenizer(shared, "qwen2")
    assert tok.tokenize(b"a\xffb", add_bos=False) == tok.tokenize("a\ufffdb", add_bos=False)
    assert tok.tokenize(b"\xe2\x82", add_bos=False) == tok.tokenize("\ufffd\ufffd", add_bos=False)
    assert tok.detokenize(tok.tokenize(b"x\xed\xa0\x80y", add_bos=False)) == b"x\xed\xa0\x80y"
    assert utf8_codepoints(b"\xc0\x80\xf4\x90\x80\x80") == "\x00" + "\ufffd" * 4
