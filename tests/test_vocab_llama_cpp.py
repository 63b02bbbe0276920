"""cooktop's tokenizers against llama.cpp itself (llama-cpp-python, in a child process): random
texts and bytes, every token's piece, the end-of-generation set, ``llama_detokenize``, every
pre-tokenizer type, and crafted vocabularies with token texts that are not UTF-8."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
import zlib

import gguf
import pytest
from conftest import skip_or_fail
from vocab_cases import VOCABS, copy_vocab, llama_cpp_safe, random_bytes, random_text, tiny_bpe, vocab_path

from cooktop.text.tokenizer import Tokenizer

CHILD = __file__.replace("test_vocab_llama_cpp.py", "llama_cpp_vocab_child.py")
PRES = ("default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "smollm", "starcoder", "refact", "deepseek-llm",
        "deepseek-coder", "deepseek-v3", "falcon", "mpt", "command-r", "gpt-4o", "tekken")
N_RANDOM = 150


def inputs(seed: str, n: int) -> list[bytes]:
    """``n`` random texts and up to ``n`` random byte strings llama.cpp accepts."""
    rng = random.Random(zlib.crc32(seed.encode()))
    texts = [random_text(rng).encode() for _ in range(n)]
    return texts + [b for b in (random_bytes(rng) for _ in range(n)) if llama_cpp_safe(b)]


def id_lists(tok, seed: str) -> list[list[int]]:
    rng = random.Random(zlib.crc32(seed.encode()))
    out = []
    for _ in range(40):
        out.append(tok.tokenize(random_text(rng), add_bos=True, special=True))
        out.append([rng.randrange(tok.n_vocab) for _ in range(rng.randint(1, 8))])
        out.append(tok.tokenize(rng.choice(["Hello , world !", " it 's", "I 'm here .", "a ' b", "we 've , they 're",
                                            " don 't ?"]), add_bos=rng.random() < 0.5))
    return out


@pytest.fixture(scope="module")
def oracle(shared, tmp_path_factory):
    """llama.cpp's answers for every job below, from one child process."""
    if importlib.util.find_spec("llama_cpp") is None:
        skip_or_fail("llama_cpp", "llama-cpp-python is not installed (pip install -e .[compare])")
    tmp = tmp_path_factory.mktemp("vocab")
    paths = {name: vocab_path(shared, name) for name in VOCABS}
    for pre in PRES:  # GPT-2's vocabulary under each pre-tokenizer: same merges, llama.cpp's other splitting
        paths[f"pre:{pre}"] = copy_vocab(paths["gpt-2"], tmp / f"{pre}.gguf",
                                         tokenizer__ggml__pre=(gguf.GGUFValueType.STRING, pre))
    paths["crafted"] = tiny_bpe(tmp / "crafted.gguf", extra=[
        (b"\xff\xfe!", 4), (b"\x80zz", 1), ("<|eot_id|>", 1), ("<|im_end|>", 3), ("<end_of_turn>", 4),
        ("<|fim_pad|>", 3), ("<|channel|>", 3), ("<|end|>", 1), ("ab", 1)], merges=["a b"])
    jobs, keys = [], []
    for key, path in paths.items():
        toks = Tokenizer.from_gguf(path)
        n = N_RANDOM if key in VOCABS else 60
        texts = inputs(key, n) + ([b"hi\xff\xfe!there<|eot_id|>ab\x80zz"] if key == "crafted" else [])
        detok = [[ids, rs, us] for ids in id_lists(toks, key) for rs in (False, True) for us in (False, True)]
        for special in (False, True):
            whole = not special and not key.startswith("pre:")  # pieces, EOG, flags, detokenize: once per vocab
            jobs.append({"path": str(path), "texts": [t.hex() for t in texts], "special": special,
                         "info": whole, "detok": detok if whole else None})
            keys.append((key, special))
    r = subprocess.run([sys.executable, CHILD], input=json.dumps(jobs), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"llama.cpp child failed ({r.returncode}): {r.stderr[-3000:]}"
    answers = dict(zip(keys, json.loads(r.stdout)))
    return {key: (paths[key], answers[(key, False)], answers[(key, True)], jobs[keys.index((key, False))])
            for key in paths}


def _check_tokenize(path, answer_plain, answer_special, job):
    tok = Tokenizer.from_gguf(path)
    texts = [bytes.fromhex(t) for t in job["texts"]]
    for special, answer in ((False, answer_plain), (True, answer_special)):
        bad = [(t, want, tok.tokenize(t, add_bos=False, special=special)) for t, want in zip(texts, answer["tok"])
               if tok.tokenize(t, add_bos=False, special=special) != want]
        assert not bad, f"{len(bad)}/{len(texts)} differ (special={special}), first: {bad[0]}"
    return tok


@pytest.mark.parametrize("name", VOCABS + ("crafted",))
def test_vocab_matches_llama_cpp(oracle, name):
    path, plain, special, job = oracle[name]
    tok = _check_tokenize(path, plain, special, job)
    for sp, want in ((False, plain["pieces"]), (True, plain["pieces_sp"])):
        bad = [i for i in range(tok.n_vocab) if tok.token_to_piece(i, special=sp).hex() != want[i]]
        assert not bad, f"{len(bad)} pieces differ (special={sp}), first {bad[0]}: {tok.token_to_piece(bad[0], sp)!r}"
    assert sorted(tok.eog_ids) == plain["eog"]
    assert (tok.bos_id, tok.eos_id, tok.vocab.add_bos, tok.vocab.add_eos) == (
        plain["bos"], plain["eos"], plain["add_bos"], plain["add_eos"])
    bad = [(d, want) for d, want in zip(job["detok"], plain["detok"])
           if tok.detokenize_llama(d[0], remove_special=d[1], unparse_special=d[2]).hex() != want]
    assert not bad, f"{len(bad)}/{len(job['detok'])} llama_detokenize results differ, first: {bad[0]}"


@pytest.mark.parametrize("pre", PRES)
def test_pre_tokenizer_matches_llama_cpp(oracle, pre):
    path, plain, special, job = oracle[f"pre:{pre}"]
    _check_tokenize(path, plain, special, job)
