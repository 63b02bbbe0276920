"""Pre-tokenizers of byte-level BPE vocabularies, chosen by ``tokenizer.ggml.pre``, as llama.cpp runs them.

A pre-tokenizer cuts a text into words; BPE then merges inside each word only.
llama.cpp (``src/llama-vocab.cpp`` ``llm_tokenizer_bpe``, ``src/unicode.cpp``
``unicode_regex_split``) gives each pre-tokenizer type a list of regexes applied
one after the other: each regex cuts every piece of the previous pass into its
matches and the text between them. Three details decide the exact output, and
this module reproduces each:

* **Text to code points** (:func:`utf8_codepoints`): UTF-8 is decoded without
  checks on overlong forms or surrogates; a byte that cannot start or complete a
  sequence becomes U+FFFD (``unicode_cpts_from_utf8``). So an invalid byte is
  tokenized as U+FFFD, as llama.cpp does.
* **Character classes** come from llama.cpp's own Unicode table (Unicode 15.1,
  :mod:`cooktop.text.unicode_data`), not from Python's or the ``regex`` package's
  newer Unicode, and ``\\s`` is its 25-code-point whitespace set.
* **How each regex runs.** The GPT-2, Llama 3 and Qwen2 regexes run as llama.cpp's
  hand-written splitters (``unicode_regex_split_custom_*``; Qwen3.5's too), whose results are those
  of the regex with the classes above; here they are that regex with the classes
  spelled out. Any other regex that names a ``\\p{..}`` class runs, as in llama.cpp,
  on a *collapsed* text where every code point >= 128 is replaced by one placeholder
  per category (whitespace by ``\\v``) and each ``\\p{..}`` by ``[placeholder +
  its ASCII members]``; so ``\\p{Lu}`` matches every non-ASCII letter, as it does in
  llama.cpp. A regex without ``\\p{..}`` runs on the text with non-ASCII whitespace
  replaced by ``\\v``, with ASCII-only ``\\s``/``\\d``.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from functools import cache

from ..errors import UnsupportedModelError
from . import unicode_data

_REPLACEMENT = "\ufffd"


def utf8_codepoints(raw: bytes) -> str:
    """The code points of ``raw`` as llama.cpp decodes it (``unicode_cpts_from_utf8``), as a str.

    Valid UTF-8 decodes as usual. Otherwise a lead byte takes its continuation bytes
    without checking for overlong forms or surrogates (``ED A0 80`` gives the lone
    surrogate U+D800, ``C0 80`` gives U+0000), and a byte that is not a lead byte
    of a complete sequence becomes U+FFFD, one per byte. A 4-byte form above
    U+10FFFF (on which llama.cpp throws) is treated as invalid, U+FFFD per byte.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out: list[str] = []
    n, i = len(raw), 0
    while i < n:
        b = raw[i]
        if b < 0x80:
            out.append(chr(b))
            i += 1
            continue
        if b < 0xC0:
            ln, cp = 0, 0
        elif b < 0xE0:
            ln, cp = 2, b & 0x1F
        elif b < 0xF0:
            ln, cp = 3, b & 0x0F
        elif b < 0xF8:
            ln, cp = 4, b & 0x07
        else:
            ln, cp = 0, 0
        if ln == 0 or i + ln > n or any(raw[i + k] & 0xC0 != 0x80 for k in range(1, ln)):
            out.append(_REPLACEMENT)
            i += 1
            continue
        for k in range(1, ln):
            cp = (cp << 6) | (raw[i + k] & 0x3F)
        if cp > 0x10FFFF:
            out.append(_REPLACEMENT)
            i += 1
            continue
        out.append(chr(cp))
        i += ln
    return "".join(out)


def category(cp: int) -> str:
    """llama.cpp's category of code point ``cp``: one of U N L Z M P S C (see :mod:`unicode_data`)."""
    if cp >= 0x110000:
        return "U"
    return unicode_data.RANGE_CATEGORIES[bisect.bisect_right(unicode_data.RANGE_STARTS, cp) - 1]


@cache
def _class(cat: str) -> str:
    """The members of category ``cat`` written as the inside of a regex ``[...]``."""
    starts, cats = unicode_data.RANGE_STARTS, unicode_data.RANGE_CATEGORIES
    parts = []
    for i, c in enumerate(cats):
        if c == cat:
            lo, hi = starts[i], (starts[i + 1] - 1 if i + 1 < len(starts) else 0x10FFFF)
            parts.append(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}")
    return "".join(parts)


def _ws() -> str:
    return "".join(f"\\U{c:08x}" for c in sorted(unicode_data.WHITESPACE))


# -- the regexes, exactly as llama.cpp's llm_tokenizer_bpe lists them --------------------------------

_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN2 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
#: Qwen3.5: qwen2's, with letter runs taking combining marks (``[\p{L}\p{M}]+``)
_QWEN35 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_CASED = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+{c}"
          "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*{c}")

_REGEXES: dict[str, tuple[str, ...]] = {
    "default": ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "starcoder": ("\\p{N}", _GPT2),
    "falcon": ("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
        "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
        "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
        "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
        "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
        "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
        "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
        "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
        "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
        "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
        "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
        "\\s+$",
        "[一-龥ࠀ-一가-퟿]+",
        "\\p{N}+",
    ),
    "deepseek-coder": ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"),
    "deepseek-v3": (
        "\\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    "tekken": (_CASED.replace("{c}", "") + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "gpt-4o": (_CASED.replace("{c}", _CONTRACTIONS + "?")
               + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
}


@dataclasses.dataclass(frozen=True)
class PreType:
    """What a ``tokenizer.ggml.pre`` value selects (llama.cpp ``llama_vocab::impl::load``).

    Attributes:
        regexes: key into the regex lists (the ``LLAMA_VOCAB_PRE_TYPE_*`` family).
        clean_spaces: ``llama_detokenize`` removes the space before ``?!.,`` and some
            apostrophes (``clean_up_tokenization_spaces``).
        ignore_merges: a word that is a token is emitted whole, without merging.
        add_bos: the default of ``add_bos`` (the file's ``add_bos_token`` overrides it).
        no_bos: the BOS id is cleared (ChatGLM).
    """

    regexes: str
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False


_LLAMA3_TYPE = PreType("llama3", ignore_merges=True, add_bos=True)
_QWEN2_TYPE = PreType("qwen2", clean_spaces=False)

#: ``tokenizer.ggml.pre`` values cooktop knows, with llama.cpp's settings for each.
PRE_TYPES: dict[str, PreType] = {
    "default": PreType("default"),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
                    _LLAMA3_TYPE),
    "dbrx": PreType("llama3"),
    "smaug-bpe": PreType("llama3"),
    "chatglm-bpe": PreType("llama3", no_bos=True),
    "glm4": PreType("llama3", no_bos=True),
    "deepseek-llm": PreType("deepseek-llm", clean_spaces=False),
    "deepseek-coder": PreType("deepseek-coder", clean_spaces=False),
    "deepseek-v3": PreType("deepseek-v3", clean_spaces=False),
    "falcon": PreType("falcon"),
    "mpt": PreType("gpt2"),
    "starcoder": PreType("starcoder"),
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "exaone4", "olmo", "jais"), PreType("gpt2")),
    "trillion": PreType("gpt2", clean_spaces=False),
    "granite-docling": PreType("gpt2", clean_spaces=False),
    "refact": PreType("starcoder"),
    "command-r": PreType("starcoder", clean_spaces=False),
    "smollm": PreType("starcoder", clean_spaces=False),
    "codeshell": PreType("starcoder"),
    "exaone": PreType("starcoder"),
    "minerva-7b": PreType("starcoder"),
    "mellum2": PreType("starcoder"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), _QWEN2_TYPE),
    "qwen35": PreType("qwen35", clean_spaces=False),
    "megrez": PreType("qwen2"),
    "stablelm2": PreType("qwen2"),
    "hunyuan": _QWEN2_TYPE,
    "solar-open": _QWEN2_TYPE,
    "tekken": PreType("tekken", clean_spaces=False, ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), PreType("gpt-4o", clean_spaces=False)),
}


def pre_type(name: str) -> PreType:
    """The :class:`PreType` of a ``tokenizer.ggml.pre`` value.

    Raises:
        UnsupportedModelError: ``name`` is not a pre-tokenizer cooktop knows (named in the message).
    """
    try:
        return PRE_TYPES[name]
    except KeyError:
        raise UnsupportedModelError(
            f"unknown pre-tokenizer type {name!r} (tokenizer.ggml.pre): cooktop knows "
            f"{', '.join(sorted(PRE_TYPES))}") from None


# -- running the regexes -----------------------------------------------------------------------

# llama.cpp unicode_regex_split: \p{..} names it collapses, their placeholder, their ASCII members.
_UCAT = {"\\p{N}": "N", "\\p{L}": "L", "\\p{P}": "P", "\\p{M}": "M", "\\p{S}": "S",
         "\\p{Lu}": "L", "\\p{Ll}": "L", "\\p{Lt}": "L", "\\p{Lm}": "L", "\\p{Lo}": "L"}
_PLACEHOLDER = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_ASCII_MEMBERS = {
    "N": "0-9", "L": "A-Za-z", "P": "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", "M": "", "S": "\\$\\+<->^`\\|\\~",
}


class _Collapse(dict):
    """``str.translate`` table: code point -> llama.cpp's one-character stand-in (filled on demand)."""

    def __missing__(self, cp: int) -> int:
        if cp < 128:
            v = cp
        elif cp in unicode_data.WHITESPACE:
            v = 0x0B
        else:
            v = ord(_PLACEHOLDER.get(category(cp), "\xd0"))
        self[cp] = v
        return v


_COLLAPSE = _Collapse()
_WIDE_WS = {c: 0x0B for c in unicode_data.WHITESPACE if c >= 0x80}


def _collapse_regex(expr: str) -> str:
    """llama.cpp's rewrite of a regex for the collapsed text (``\\p{X}`` -> ``[placeholder + ASCII]``)."""
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif expr.startswith("\\p{", i) and (end := expr.find("}", i + 3)) != -1 and end <= i + 10 \
                and expr[i:end + 1] in _UCAT:
            cat = _UCAT[expr[i:end + 1]]
            body = re.escape(_PLACEHOLDER[cat]) + _ASCII_MEMBERS[cat]
            out.append(body if inside else f"[{body}]")
            i = end
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _ecmascript_dollar(expr: str) -> str:
    """ECMAScript ``$`` (end of input only) as Python's ``\\Z``."""
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "\\":
            out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]":
            inside = False
        out.append("\\Z" if c == "$" and not inside else c)
        i += 1
    return "".join(out)


def _exact_regex(expr: str) -> str:
    """A regex with ``\\p{L}``, ``\\p{N}``, ``\\s``, ``\\S`` spelled out from llama.cpp's tables."""
    sub = {"\\p{L}": _class("L"), "\\p{N}": _class("N"), "\\p{M}": _class("M"), "\\s": _ws()}
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "\\":
            esc = expr[i:i + 2]
            if esc == "\\p":
                esc = expr[i:expr.index("}", i) + 1]
            if esc in sub:
                out.append(sub[esc] if inside else f"[{sub[esc]}]")
            elif esc == "\\S" and not inside:
                out.append(f"[^{_ws()}]")
            else:
                out.append(esc)
            i += len(esc)
            continue
        if c == "[":
            inside = True
        elif c == "]":
            inside = False
        out.append(c)
        i += 1
    return "".join(out)


@cache
def _compile(expr: str) -> tuple[re.Pattern, str]:
    """(compiled pattern, text mode) for one llama.cpp regex; mode is ``plain``, ``collapsed`` or ``wide``."""
    if expr in (_GPT2, _LLAMA3, _QWEN2, _QWEN35):  # llama.cpp's hand-written splitters: the regex, exact classes
        return re.compile(_exact_regex(expr)), "plain"
    if any(u in expr for u in _UCAT):
        return re.compile(_ecmascript_dollar(_collapse_regex(expr)), re.ASCII), "collapsed"
    return re.compile(_ecmascript_dollar(expr), re.ASCII), "wide"


class PreTokenizer:
    """Splits text into the words BPE merges within (llama.cpp ``unicode_regex_split``)."""

    def __init__(self, regexes: str):
        """``regexes``: a :attr:`PreType.regexes` key."""
        self.name = regexes
        self._passes = [_compile(e) for e in _REGEXES[regexes]]

    def split(self, text: str) -> list[str]:
        """The words of ``text`` (code points, see :func:`utf8_codepoints`), in order; they concatenate to it."""
        if not text:
            return []
        variants = {"plain": text}
        spans = [(0, len(text))]
        for pat, mode in self._passes:
            t = variants.get(mode)
            if t is None:
                t = variants[mode] = text.translate(_COLLAPSE if mode == "collapsed" else _WIDE_WS)
            new: list[tuple[int, int]] = []
            for a, b in spans:
                last = a
                for m in pat.finditer(t[a:b]):
                    s, e = m.span()
                    if e == s:
                        continue
                    if a + s > last:
                        new.append((last, a + s))
                    new.append((a + s, a + e))
                    last = a + e
                if last < b:
                    new.append((last, b))
            spans = new
        return [text[a:b] for a, b in spans]
