"""gpt-oss chat: the harmony template of the GGUF renders through the jinja path, and generation
stops at ``<|return|>`` and ``<|call|>`` but not at ``<|end|>`` (which only closes a channel;
llama.cpp's o200k_harmony rule), through ``Llama.create_chat_completion`` and ``cooktop chat``.

The model is a tiny synthetic gpt-oss (``tools/synth.py``) whose vocabulary carries the harmony
special tokens and ``../shared/templates/openai-gpt-oss-120b.jinja`` as its chat template;
``logit_bias`` forces the token under test, so the assertions do not depend on random weights.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from gguf import GGUFWriter, TokenType
from test_arch_moe import SHAPES

from cooktop import Llama
from cooktop.tools import synth

HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>",
           "<|endoftext|>"]


@pytest.fixture(scope="module")
def oss(tmp_path_factory, shared):
    d = tmp_path_factory.mktemp("oss")
    tokens, scores, types = synth.vocab(300)
    first = 300 - len(HARMONY)
    tokens[first:] = HARMONY
    types[first:] = [int(TokenType.CONTROL)] * len(HARMONY)
    ids = {t: first + i for i, t in enumerate(HARMONY)}
    vocab = d / "vocab.gguf"
    w = GGUFWriter(str(vocab), "gpt-oss")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(ids["<|return|>"])
    w.add_unk_token_id(0)
    w.add_chat_template((shared / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    path = d / "oss.gguf"
    synth.write(path, SHAPES["gpt-oss"], "MXFP4_MOE", seed=4, vocab=vocab)
    return path, ids


def _chat(llm, bias_token: int, max_tokens: int) -> dict:
    return llm.create_chat_completion(messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens,
                                      temperature=0.0, logit_bias={bias_token: 100.0})


def test_harmony_template_and_stop_tokens(oss):
    path, ids = oss
    llm = Llama(model_path=str(path), n_ctx=256, verbose=False, device="cpu")
    try:
        choice = llm.chat_template_choice()
        assert choice.template.name == "the model's chat template (tokenizer.chat_template)"
        prompt = choice.template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        assert prompt.endswith("<|start|>user<|message|>hi<|end|><|start|>assistant")
        assert prompt.startswith("<|start|>system<|message|>")
        assert ids["<|return|>"] in llm._tokenizer.eog_ids and ids["<|call|>"] in llm._tokenizer.eog_ids
        assert ids["<|end|>"] not in llm._tokenizer.eog_ids
        for stop in ("<|return|>", "<|call|>"):
            r = _chat(llm, ids[stop], 8)
            assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] <= 1, stop
        r = _chat(llm, ids["<|end|>"], 3)  # closes a channel only: the answer goes on to max_tokens
        assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 3
    finally:
        llm.close()


def test_cooktop_chat_answers_and_stops(oss):
    path, _ = oss
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "chat", "-m", str(path), "--device", "cpu",
                        "-p", "hi", "-n", "4", "-c", "256"], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert "chat template: " in r.stderr
