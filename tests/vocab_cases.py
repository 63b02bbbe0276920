"""Helpers for the tokenizer tests: llama.cpp's vocabulary test vectors, random texts, tiny vocabularies."""

from __future__ import annotations

import os
import pathlib
import random

import gguf

SHARED = pathlib.Path(os.environ.get("COOKTOP_SHARED", pathlib.Path(__file__).resolve().parents[2] / "shared"))
#: The vocabularies of ../shared/vocab with llama.cpp's expected ids.
VOCABS = ("llama-spm", "gpt-2", "llama-bpe", "qwen2", "starcoder")
BPE_VOCABS = VOCABS[1:]


def vocab_path(shared: pathlib.Path, name: str) -> pathlib.Path:
    return shared / "vocab" / f"ggml-vocab-{name}.gguf"


def read_vocab_tests(base: pathlib.Path) -> list[tuple[bytes, list[int]]]:
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


# Pieces random texts are made of: scripts, digits, every kind of whitespace, contractions,
# punctuation and symbols, marks, emoji, special-token texts.
_POOLS = (
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  ", "\t", "\n", "\r", "\r\n",
    "\v\f", "'", "'s", "'S", "'ll", "'RE", "'ve", "'t", "'d", "'m", ".,!?;:", "()[]{}<>", "$+<=>^~|`", "-_/\\@#%&*\"",
    "\u00a0", "\u3000", "\u2028", "\x85", "\u1680\u2003", "éèêëàâäôöûüçñß", "ÀÉÎÕÜ", "αβγδΩ", "абвгдЖЯ",
    "中文字符测试", "日本語のテキスト", "한국어", "العربية", "हिन्दी", "ไทย", "٠١٢٣٤٥", "０１２３", "①②③", "½¾",
    "😀🦙👍🏽", "\u0301\u0308", "\u200b\u200d", "\ufeff", "ﬁﬂ", "ſ", "K", "™©®", "\u00ad", "\x00\x01\x1b\x7f",
    "<s>", "</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<fim_prefix>", "...", "!!!", "???", "--", "   \n\n  ",
)


def random_text(rng: random.Random) -> str:
    """A short text mixing the pools above with random code points from the whole Unicode range."""
    parts = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.75:
            pool = rng.choice(_POOLS)
            if len(pool) > 3 and rng.random() < 0.6:
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
            else:
                parts.append(pool)
        elif r < 0.9:
            parts.append(chr(rng.choice([rng.randint(0x20, 0x2FFF), rng.randint(0x3000, 0xD7FF),
                                         rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])))
        else:
            parts.append(" " * rng.randint(1, 5))
    return "".join(parts)


def random_bytes(rng: random.Random) -> bytes:
    """Random bytes: pieces of UTF-8 text, stray high bytes, any bytes (mostly not valid UTF-8)."""
    b = bytearray()
    for _ in range(rng.randint(1, 20)):
        r = rng.random()
        if r < 0.4:
            b += random_text(rng).encode()[:rng.randint(1, 8)]
        elif r < 0.7:
            b.append(rng.randint(0x80, 0xFF))
        else:
            b.append(rng.randint(0, 255))
    return bytes(b)


def llama_cpp_safe(b: bytes) -> bool:
    """False when llama.cpp would decode a 4-byte form above U+10FFFF (it throws through the C API)."""
    i, n = 0, len(b)
    while i < n:
        c = b[i]
        if 0xF0 <= c < 0xF8 and i + 3 < n and all(b[i + k] & 0xC0 == 0x80 for k in (1, 2, 3)):
            cp = ((c & 7) << 18) | ((b[i + 1] & 0x3F) << 12) | ((b[i + 2] & 0x3F) << 6) | (b[i + 3] & 0x3F)
            if cp > 0x10FFFF:
                return False
            i += 4
            continue
        i += 1
    return True


def write_vocab(path: pathlib.Path, kv: dict) -> pathlib.Path:
    """A vocabulary-only GGUF with the given ``{key: (GGUFValueType, value)}`` metadata.

    String values and string-array elements may be ``bytes`` (written as they are).
    """
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (vtype, value) in kv.items():
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, list(value))
        else:
            w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def copy_vocab(src: pathlib.Path, dst: pathlib.Path, **changes) -> pathlib.Path:
    """Rewrite a vocabulary GGUF (read with cooktop's raw reader, so in seconds), with
    ``key=(GGUFValueType, value)`` changes (None removes the key; dots in keys as ``__``)."""
    from cooktop.format.gguf import read_raw_metadata

    md = read_raw_metadata(src)
    kv = {}
    for key, v in md.items():
        if key == "general.architecture":
            continue
        value = v.value.tolist() if v.sub_type is not None and v.sub_type != gguf.GGUFValueType.STRING else v.value
        kv[key] = (v.type, value)
    for key, change in changes.items():
        key = key.replace("__", ".")
        if change is None:
            kv.pop(key, None)
        else:
            kv[key] = change
    return write_vocab(dst, kv)


def tiny_bpe(path: pathlib.Path, *, pre: str | None = "gpt-2", extra=(), merges=("a b",), kv=None) -> pathlib.Path:
    """A byte-level BPE vocabulary: the 256 byte tokens (ids 0..255, GPT-2's byte-to-unicode order),
    then ``extra`` ``(text, token type)`` tokens; ``merges`` / ``pre`` None leave the key out."""
    from cooktop.text.bpe import BYTE_TO_UNICODE

    tokens = [c.encode() for c in BYTE_TO_UNICODE] + [t.encode() if isinstance(t, str) else t for t, _ in extra]
    types = [1] * 256 + [ty for _, ty in extra]
    md = {"tokenizer.ggml.model": (gguf.GGUFValueType.STRING, "gpt2"),
          "tokenizer.ggml.tokens": (gguf.GGUFValueType.ARRAY, tokens),
          "tokenizer.ggml.token_type": (gguf.GGUFValueType.ARRAY, types)}
    if merges is not None:
        md["tokenizer.ggml.merges"] = (gguf.GGUFValueType.ARRAY, [m.encode() if isinstance(m, str) else m
                                                                  for m in merges])
    if pre is not None:
        md["tokenizer.ggml.pre"] = (gguf.GGUFValueType.STRING, pre)
    md.update(kv or {})
    return write_vocab(path, md)
