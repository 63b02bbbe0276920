"""Fuzzing with hypothesis: everything that reads untrusted bytes.

- **GGUF**: random files and mutations (bit flips, interesting integers written over
  counts, lengths, types and offsets, truncation, insertion, deletion, splices) of
  every valid file in ``../shared/models`` and ``../shared/vocab``, read the ways
  cooktop reads them: :func:`~cooktop.format.gguf.read_raw_metadata` and the
  vocabulary built from it (``Llama(vocab_only=True)``), then
  :func:`~cooktop.format.gguf.open_gguf`, the model config and the vocabulary from
  the opened file; every tensor view is touched.
- **Tokenizer**: random text, bytes (invalid UTF-8 included) and pieces of the
  vocabulary (special tokens among them) through ``tokenize``/``detokenize`` of
  every vocabulary that loads (SPM and byte-level BPE), and random ids through
  ``detokenize``. On valid UTF-8 the round trip is exact (SPM: without U+2581).

Only :class:`~cooktop.errors.CooktopError` subclasses may escape; each example runs
under a hard deadline (:data:`DEADLINE_S` of CPU time, a SIGPROF that raises ``Hang``) and a
memory bound (tracemalloc peak under :data:`MEMORY_LIMIT` plus 8x the input size).

The normal test run tries a few dozen examples of each (seconds) on the vocabularies
up to 2 MiB. ``make fuzz`` sets ``COOKTOP_FUZZ_EXAMPLES`` (100000 there) for the long
run over every vocabulary and prints how many inputs it tried.

The mutation seeds are *shrunk* copies of the shared files (:func:`shrink_gguf`: arrays cut
to :data:`SEED_ARRAY_ITEMS` elements), because gguf's GGUFReader spends seconds on a
150k-token vocabulary and a fuzzer wants thousands of inputs a minute; the model files are
opened whole once as a baseline (the vocabularies too in the long run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import struct
import time
import tracemalloc

import numpy as np
import pytest
from conftest import SHARED, skip_or_fail
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cooktop.errors import CooktopError

LONG_EXAMPLES = int(os.environ.get("COOKTOP_FUZZ_EXAMPLES", "0") or 0)
LONG = LONG_EXAMPLES > 0
GGUF_EXAMPLES = LONG_EXAMPLES or 40
TOKENIZER_EXAMPLES = LONG_EXAMPLES or 150
#: Seconds one example may take before it counts as a hang.
DEADLINE_S = float(os.environ.get("COOKTOP_FUZZ_DEADLINE", "30"))
#: Python-heap bytes one example may allocate at peak, besides 8x its input.
MEMORY_LIMIT = 256 << 20
#: Elements kept per metadata array in the shrunk seeds.
SEED_ARRAY_ITEMS = 40
#: Vocabularies used by the short run (the two big BPE ones take seconds each).
SHORT_RUN_MAX_BYTES = 2 << 20

COUNTS: dict[str, int] = {"gguf": 0, "gguf_opened": 0, "tokenizer": 0}

_SETTINGS = dict(deadline=None, database=None if not LONG else settings.default.database,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture],
                 derandomize=not LONG, print_blob=True)


class Hang(Exception):
    """An example ran past :data:`DEADLINE_S`."""


SLOWEST: dict[str, tuple[float, str]] = {}


@contextlib.contextmanager
def bounded(n_input_bytes: int, what: str = "", label: str = ""):
    """Run the block under the hang deadline and the memory bound (see the module docstring).

    The deadline counts the process's CPU time (ITIMER_PROF, SIGPROF): a loaded machine or
    ``nice`` cannot fake a hang, and pytest-timeout's SIGALRM stays untouched. The handler
    raises :class:`Hang` and also sets a flag checked afterwards, because an exception raised
    inside a garbage-collector callback is swallowed by Python. The slowest example per
    ``what`` (CPU seconds, ``label``) is kept for the report.
    """
    hung: list[bool] = []

    def on_deadline(signum, frame):
        hung.append(True)
        raise Hang(f"example still running after {DEADLINE_S:g} s of CPU time")

    old_handler = signal.signal(signal.SIGPROF, on_deadline)
    signal.setitimer(signal.ITIMER_PROF, DEADLINE_S)
    t0 = time.process_time()
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak <= MEMORY_LIMIT + 8 * n_input_bytes, f"peak Python heap {peak} bytes for {n_input_bytes} input"
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old_handler)
        spent = time.process_time() - t0
        if what and spent > SLOWEST.get(what, (0.0, ""))[0]:
            SLOWEST[what] = (spent, label)
    if hung:
        raise Hang(f"example ran past {DEADLINE_S:g} s of CPU time ({spent:.1f} s): {label}")


# -- seeds ------------------------------------------------------------------------------------

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> bytes
_STRING, _ARRAY = 8, 9


def shrink_gguf(data: bytes, max_items: int = SEED_ARRAY_ITEMS) -> tuple[bytes, int]:
    """A valid GGUF like ``data`` with every metadata array cut to ``max_items`` elements.

    Walks the header (ggml docs/gguf.md) with ``struct``; tensor infos and the data
    section are kept (offsets are relative to the data section, which moves).
    Returns ``(bytes, header length)``.
    """
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    out = bytearray(data[:24])
    align = 32

    def take(n: int) -> bytes:
        nonlocal pos
        b = data[pos:pos + n]
        pos += n
        return b

    def string() -> bytes:
        n = struct.unpack_from("<Q", data, pos)[0]
        return take(8 + n)

    def value(vt: int, keep: bool = True) -> bytes:
        if vt in _SCALAR:
            return take(_SCALAR[vt])
        if vt == _STRING:
            return string()
        et, count = struct.unpack("<IQ", take(12))
        n = min(count, max_items)
        parts = [value(et) for _ in range(n)]
        for _ in range(count - n):
            value(et)
        return struct.pack("<IQ", et, n) + b"".join(parts)

    for _ in range(n_kv):
        key = string()
        vt = struct.unpack("<I", take(4))[0]
        v = value(vt)
        if key[8:] == b"general.alignment":
            align = struct.unpack("<I", v)[0]
        out += key + struct.pack("<I", vt) + v
    for _ in range(n_tensors):
        name = string()
        n_dims = struct.unpack_from("<I", data, pos)[0]
        out += name + take(4 + 8 * n_dims + 4 + 8)
    data_start = -(-pos // align) * align
    header_len = len(out)
    out += b"\0" * (-len(out) % align)
    out += data[data_start:]
    return bytes(out), header_len


@dataclasses.dataclass(frozen=True)
class Seed:
    name: str
    data: bytes
    header_len: int


def _shared_ggufs() -> list[pathlib.Path]:
    files = sorted((SHARED / "models").rglob("*.gguf")) + sorted((SHARED / "vocab").glob("*.gguf"))
    if not files:
        skip_or_fail("shared", f"no GGUF files under {SHARED}")
    return files


@pytest.fixture(scope="module")
def seeds() -> list[Seed]:
    from cooktop.format.gguf import open_gguf

    out = []
    for p in _shared_ggufs():
        data, hl = shrink_gguf(p.read_bytes())
        out.append(Seed(p.name, data, hl))
    # the shrunk seeds are valid files
    tmp = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"cooktop-fuzz-seed-{os.getpid()}.gguf"
    try:
        for s in out:
            tmp.write_bytes(s.data)
            open_gguf(tmp)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# -- GGUF -------------------------------------------------------------------------------------

_U64 = [0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 255, 256, 4095, 4096, 65535, 1 << 16, (1 << 31) - 1, 1 << 31,
        (1 << 32) - 1, 1 << 32, 1 << 40, (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
_U32 = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 30, 31, 39, 40, 41, 255, 1 << 16,
        (1 << 31) - 1, 1 << 31, (1 << 32) - 1]


@dataclasses.dataclass(frozen=True)
class Input:
    """A fuzz input, printed short: a seed and its mutations, or raw bytes."""

    seed: str
    ops: tuple = ()
    raw: bytes = b""

    def build(self, seeds: dict[str, Seed]) -> bytes:
        if not self.seed:
            return self.raw
        data = bytearray(seeds[self.seed].data)
        for op, pos, arg in self.ops:
            if not data:
                break
            pos = min(pos, len(data) - 1)
            if op == "flip":
                data[pos] ^= 1 << arg
            elif op == "byte":
                data[pos] = arg
            elif op == "u32":
                data[pos:pos + 4] = struct.pack("<I", arg)
            elif op == "u64":
                data[pos:pos + 8] = struct.pack("<Q", arg)
            elif op == "truncate":
                del data[pos:]
            elif op == "insert":
                data[pos:pos] = arg
            elif op == "delete":
                del data[pos:pos + arg]
            else:  # splice: copy 64 bytes from offset arg over pos
                data[pos:pos + 64] = data[arg:arg + 64]
        return bytes(data)


@st.composite
def gguf_inputs(draw, seeds: list[Seed]) -> Input:
    """Random files with or without the magic, or 1-4 mutations of a seed (mostly in its header)."""
    kind = draw(st.sampled_from(["mutant"] * 8 + ["random", "magic"]))
    if kind == "random":
        return Input("", raw=draw(st.binary(max_size=256)))
    if kind == "magic":
        version = draw(st.sampled_from([2, 3, 1, 4, 0xFFFFFFFF]))
        return Input("", raw=b"GGUF" + struct.pack("<I", version) + draw(st.binary(max_size=512)))
    seed = draw(st.sampled_from(seeds))
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.one_of(st.integers(0, seed.header_len - 1), st.integers(0, len(seed.data) - 1)))
        op = draw(st.sampled_from(["flip", "byte", "u32", "u64", "truncate", "insert", "delete", "splice"]))
        arg = {"flip": st.integers(0, 7), "byte": st.integers(0, 255), "u32": st.sampled_from(_U32),
               "u64": st.sampled_from(_U64), "truncate": st.just(0), "insert": st.binary(min_size=1, max_size=16),
               "delete": st.integers(1, 16), "splice": st.integers(0, len(seed.data) - 1)}[op]
        ops.append((op, pos, draw(arg)))
    return Input(seed.name, tuple(ops))


def exercise_gguf(path: pathlib.Path) -> None:
    """Read ``path`` the ways cooktop does (the raw metadata reader and the vocabulary built from
    it, then open_gguf, the model config and the vocabulary from the GGUFFile); only
    CooktopError may escape."""
    from cooktop.format.gguf import open_gguf, read_raw_metadata
    from cooktop.model.config import load_config
    from cooktop.text.tokenizer import Tokenizer

    with contextlib.suppress(CooktopError):
        Tokenizer.from_gguf(read_raw_metadata(path))
    g = open_gguf(path)
    COUNTS["gguf_opened"] += 1
    for t in g.tensors.values():
        assert t.data.nbytes == t.n_bytes
        flat = np.asarray(t.data).reshape(-1).view(np.uint8)
        int(flat[0]) + int(flat[-1])  # the view's first and last bytes are readable
    for _ in g.metadata.items():
        pass
    with contextlib.suppress(CooktopError):
        load_config(g)
    with contextlib.suppress(CooktopError):
        Tokenizer.from_gguf(g)


def test_gguf_originals_open(seeds):
    """Baseline: every shared file opens (the seeds' originals)."""
    from cooktop.format.gguf import open_gguf

    for p in _shared_ggufs():
        if LONG or p.parent.name != "vocab":  # vocabularies take seconds each: the long run only
            assert open_gguf(p).version in (2, 3)


def test_fuzz_gguf(seeds, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "input.gguf"
    by_name = {s.name: s for s in seeds}

    @settings(max_examples=GGUF_EXAMPLES, **_SETTINGS)
    @given(gguf_inputs(seeds))
    def run(inp: Input):
        COUNTS["gguf"] += 1
        data = inp.build(by_name)
        path.write_bytes(data)
        with bounded(len(data), "gguf", repr(inp)[:300]):
            try:
                exercise_gguf(path)
            except CooktopError:
                pass

    run()
    _report()


# -- tokenizer --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizers() -> dict:
    """name -> (tokenizer, is_spm, pieces) for every shared vocabulary that loads."""
    from cooktop.text.tokenizer import SpmTokenizer, Tokenizer

    out = {}
    for p in _shared_ggufs():
        if not LONG and p.stat().st_size > SHORT_RUN_MAX_BYTES:
            continue
        try:
            tok = Tokenizer.from_gguf(p)
        except CooktopError:  # a vocabulary type not supported: nothing to fuzz
            continue
        texts = [t.decode("utf-8", errors="replace") for t in tok.vocab.texts]
        pieces = texts[:64] + texts[-64:] + [t for t in texts if t.startswith("<")][:64]
        out[p.name] = (tok, isinstance(tok, SpmTokenizer), pieces)
    if not out:
        skip_or_fail("shared", "no vocabulary loads")
    return out


def _texts(pieces: list[str]):
    fragment = st.one_of(st.text(max_size=12), st.sampled_from(pieces or [" "]),
                         st.sampled_from([" ", "  ", "\n", "\t", "\u2581", "\r\n", "\u00a0", "\ufffd", "\x00"]))
    return st.lists(fragment, max_size=12).map("".join)


def _round_trips(raw: bytes, spm: bool) -> bool:
    """Whether tokenization must give ``raw`` back exactly: SPM: valid UTF-8 without U+2581;
    byte-level BPE: ASCII.

    llama.cpp's rules change other texts on purpose (llama-cpp-python 0.3.36 agrees): an input
    U+2581 is SentencePiece's space (it comes back as b" "); SPM cuts invalid UTF-8 into
    "characters" by the lead byte's length (``unicode_len_utf8``), so a stray lead byte swallows
    the escaped space after it; BPE reads invalid UTF-8 as U+FFFD, and drops the bytes a
    vocabulary has no token for (StarCoder has none for 0xF1: U+40000 comes back as 3 bytes).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return "\u2581" not in text if spm else text.isascii()


def test_fuzz_tokenizer(tokenizers):
    from cooktop.text.tokenizer import InvalidTokenError

    names = sorted(tokenizers)
    all_pieces = sorted({p for _, _, ps in tokenizers.values() for p in ps})

    @settings(max_examples=TOKENIZER_EXAMPLES, **_SETTINGS)
    @given(name=st.sampled_from(names),
           text=st.one_of(_texts(all_pieces), st.binary(max_size=200), st.text(max_size=200)),
           add_bos=st.booleans(), special=st.booleans(), ids=st.lists(st.integers(-3, 1 << 20), max_size=16))
    def run(name, text, add_bos, special, ids):
        COUNTS["tokenizer"] += 1
        tok, spm, _ = tokenizers[name]
        raw = text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass")
        with bounded(len(raw), "tokenizer", f"{name}: {text!r}"[:300]):
            try:
                out = tok.tokenize(text, add_bos=add_bos, special=special)
                assert all(isinstance(i, int) and 0 <= i < tok.n_vocab for i in out)
                back = tok.detokenize(out, special=special)
                assert isinstance(back, bytes)
                # SPM: the BOS makes detokenize drop the space SPM prepended; BPE prepends nothing
                if not special and (add_bos if spm else not add_bos) and _round_trips(raw, spm):
                    assert back == raw, (text, out, back)
                mixed = [i % tok.n_vocab if i >= 0 else i for i in ids]
                try:
                    tok.detokenize(mixed, special=special)
                except InvalidTokenError as e:
                    assert any(i < 0 for i in mixed) and "out of range" in str(e)
            except CooktopError:
                pass

    run()
    _report()


def _report() -> None:
    slow = "; ".join(f"slowest {k} input {t:.2f} s CPU: {lab}" for k, (t, lab) in sorted(SLOWEST.items()))
    line = (f"fuzz inputs tried: gguf {COUNTS['gguf']} (opened {COUNTS['gguf_opened']}), "
            f"tokenizer {COUNTS['tokenizer']}" + (f"; {slow}" if slow else ""))
    print(line)
    out = os.environ.get("COOKTOP_FUZZ_REPORT")
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


# -- what the fuzzer found (regressions) ------------------------------------------------------

def test_found_huge_string_length_in_raw_reader(tmp_path):
    """A string of 2**63 bytes in a string array sent read_raw_metadata's offset past ssize_t:
    OverflowError escaped (found by test_fuzz_gguf: one bit flipped in tiny-F16.gguf)."""
    from cooktop.errors import GGUFError
    from cooktop.format.gguf import read_raw_metadata

    key = b"tokenizer.ggml.tokens"
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    body += struct.pack("<IIQ", _ARRAY, _STRING, 2) + struct.pack("<Q", 1 << 63) + b"\0" * 32
    path = tmp_path / "huge.gguf"
    path.write_bytes(body)
    with pytest.raises(GGUFError, match=r"the file ends inside metadata key 'tokenizer.ggml.tokens' "
                                        r"\(an array of 2 strings from offset 69\)"):
        read_raw_metadata(path)
