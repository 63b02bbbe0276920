"""The llama-cpp-python surface of ``cooktop.Llama``: the tutorial, chat, options, embeddings, state."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED, rewrite_gguf, with_chat_template
from gguf import GGUFValueType

from cooktop import Llama, LlamaGrammar
from cooktop.api.options import UnsupportedArgumentError
from cooktop.engine.grammar import GrammarError
from cooktop.errors import ChatTemplateError, ContextOverflowError, CooktopError

PROMPT = "Once upon a time"
TUTORIAL = '''
from cooktop import Llama
llm = Llama(model_path=MODEL, n_ctx=4096, n_gpu_layers=35, n_batch=512)
out = llm.create_chat_completion(
    messages=[{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": "Tell me a story."}],
    max_tokens=64, temperature=0.7)
print(out["choices"][0]["message"]["content"])
'''


@pytest.fixture(scope="module")
def llm(stories):
    m = Llama(model_path=str(stories), n_ctx=256, verbose=False, device="cpu", embedding=True)
    yield m
    m.close()


def test_tutorial_runs_unchanged(stories):
    code = TUTORIAL.replace("MODEL", repr(str(stories)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={"COOKTOP_DEVICE": "cpu", "PATH": "/usr/bin:/bin", **{
                           k: v for k, v in __import__("os").environ.items() if k.startswith(("PYTHON", "HOME"))}})
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 20
    assert "using 'chatml', as llama.cpp does" in r.stderr  # the fallback says so


def test_chat_with_model_template(stories, tmp_path):
    tmpl = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}" \
           "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    path = with_chat_template(stories, tmp_path / "t.gguf", tmpl)
    m = Llama(model_path=str(path), n_ctx=256, verbose=False, device="cpu")
    msgs = [{"role": "user", "content": "hi"}]
    assert m.apply_chat_template(msgs) == "<|user|>hi</s><|assistant|>"
    ids, stops = m.chat_prompt(msgs)
    assert ids[0] == m.token_bos() and ids.count(m.token_bos()) == 1
    assert m.detokenize(ids[1:]).decode() == m.detokenize(m.tokenize("<|user|>hi</s><|assistant|>", False,
                                                                      True)).decode()
    assert "</s>" in stops
    out = m.create_chat_completion(msgs, max_tokens=16, temperature=0)
    ref = m.create_completion(ids, max_tokens=16, temperature=0, stop=stops)
    assert out["choices"][0]["message"]["content"] == ref["choices"][0]["text"]
    m.close()


def test_template_refusal_is_a_clear_error(stories, tmp_path):
    tmpl = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}x"
    m = Llama(model_path=str(with_chat_template(stories, tmp_path / "t.gguf", tmpl)), n_ctx=64, verbose=False,
              device="cpu")
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        m.create_chat_completion([{"role": "system", "content": "s"}])
    m.close()


def test_chat_format_and_unknown_name(stories):
    m = Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu", chat_format="llama-2")
    assert m.apply_chat_template([{"role": "user", "content": "hi"}]) == "[INST] hi [/INST]"
    m.close()
    with pytest.raises(ChatTemplateError, match="unknown chat format 'nope'"):
        Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu", chat_format="nope")


def test_chat_stream_equals_whole(llm):
    msgs = [{"role": "user", "content": "Tell me a story."}]
    whole = llm.create_chat_completion(msgs, max_tokens=30, temperature=0)
    chunks = list(llm.create_chat_completion(msgs, max_tokens=30, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert whole["usage"]["completion_tokens"] == 30


def test_str_prompt_parses_special_tokens(llm):
    assert llm.tokenize("<s>x", add_bos=False, special=True)[0] == llm.token_bos()
    a = llm.create_completion("</s>", max_tokens=1, temperature=0)
    assert a["usage"]["prompt_tokens"] == 2  # BOS + the EOS token, not its letters


def test_completion_logprobs_shape(llm):
    out = llm.create_completion(PROMPT, max_tokens=5, temperature=0, logprobs=3)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in lp["tokens"][:-1]]))
    for tok, lpv, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 3 and max(top.values()) == pytest.approx(lpv) and top[tok] == pytest.approx(lpv)
    # the logprob is log_softmax of the model's logits
    llm.reset()
    ids = llm.tokenize(PROMPT)
    llm.eval(ids)
    row = llm.scores[-1].astype(np.float64)
    want = row - row.max() - np.log(np.exp(row - row.max()).sum())
    assert lp["token_logprobs"][0] == pytest.approx(want.max(), abs=1e-5)
    with pytest.raises(CooktopError, match="logprobs"):
        llm.create_completion(PROMPT, logprobs=50)


def test_logit_bias_penalties_typical_seed(llm):
    base = llm.create_completion(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
    first = llm._last.tokens[0]
    banned = llm.create_completion(PROMPT, max_tokens=8, temperature=0, logit_bias={str(first): -100})
    assert banned["choices"][0]["text"] != base
    pen = llm.create_completion(PROMPT, max_tokens=40, temperature=0, frequency_penalty=2.0, presence_penalty=1.0)
    plain = llm.create_completion(PROMPT, max_tokens=40, temperature=0)
    assert pen["choices"][0]["text"] != plain["choices"][0]["text"]
    a = llm.create_completion(PROMPT, max_tokens=16, temperature=1.0, typical_p=0.5, seed=7)
    b = llm.create_completion(PROMPT, max_tokens=16, temperature=1.0, typical_p=0.5, seed=7)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    llm.set_seed(11)
    c = llm.create_completion(PROMPT, max_tokens=16, temperature=1.0)
    llm.set_seed(11)
    assert llm.create_completion(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"] == \
        c["choices"][0]["text"]
    llm.set_seed(-1)
    with pytest.raises(CooktopError, match="logit_bias"):
        llm.create_completion(PROMPT, logit_bias={"x": 1})
    with pytest.raises(CooktopError, match="typical_p"):
        llm.create_completion(PROMPT, typical_p=2.0)


def test_stopping_criteria_and_logits_processor(llm):
    seen = []

    def stop_after_3(ids, logits):
        seen.append(len(ids))
        return len(seen) >= 3

    out = llm.create_completion(PROMPT, max_tokens=20, temperature=0, stopping_criteria=[stop_after_3])
    assert out["usage"]["completion_tokens"] == 3 and out["choices"][0]["finish_reason"] == "stop"
    nl = llm.token_nl()

    def only_newline(ids, scores):
        out = np.full_like(scores, -1e9)
        out[nl] = 0.0
        return out

    out = llm.create_completion(PROMPT, max_tokens=4, temperature=0, logits_processor=[only_newline])
    assert out["choices"][0]["text"] == "\n" * 4


def test_grammar_and_response_format(llm):
    out = llm.create_completion(PROMPT, max_tokens=10, temperature=0.9, seed=1,
                                grammar=LlamaGrammar.from_string('root ::= "yes" | "no"'))
    assert out["choices"][0]["text"] in ("yes", "no") and out["choices"][0]["finish_reason"] == "stop"
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["age"], "additionalProperties": False}
    chat = llm.create_chat_completion([{"role": "user", "content": "age?"}], max_tokens=40, temperature=0,
                                      response_format={"type": "json_object", "schema": schema})
    assert set(json.loads(chat["choices"][0]["message"]["content"])) == {"age"}
    # llama.cpp's reading: an object listing properties takes no others unless additionalProperties says so
    open_schema = {k: v for k, v in schema.items() if k != "additionalProperties"}
    out = llm.create_completion(PROMPT, max_tokens=60, temperature=0,
                                grammar=LlamaGrammar.from_json_schema(open_schema))
    assert set(json.loads(out["choices"][0]["text"])) == {"age"}
    from cooktop.engine.grammar import closed_objects
    nested = {"properties": {"properties": {"type": "object", "properties": {"a": {}}}},
              "$defs": {"d": {"properties": {}}}, "anyOf": [{"properties": {"x": {}}}, {"type": "string"}]}
    assert closed_objects(nested) == {
        "properties": {"properties": {"type": "object", "properties": {"a": {}}, "additionalProperties": False}},
        "$defs": {"d": {"properties": {}, "additionalProperties": False}},
        "anyOf": [{"properties": {"x": {}}, "additionalProperties": False}, {"type": "string"}],
        "additionalProperties": False}
    assert closed_objects({"type": "object"}) == {"type": "object"}  # no properties: any object
    with pytest.raises(GrammarError, match="does not compile"):
        LlamaGrammar.from_string("root ::= (")
    with pytest.raises(GrammarError, match="not both"):
        llm.create_chat_completion([{"role": "user", "content": "x"}], grammar='root ::= "a"',
                                   response_format={"type": "json_object"})


def test_suffix_fim(stories, tmp_path):
    """With FIM token ids the prompt is [BOS] <PRE> prompt <SUF> suffix <MID> (llama-cpp-python's PSM order)."""
    extra = [(f"tokenizer.ggml.{k}_token_id", v, GGUFValueType.UINT32) for k, v in
             (("prefix", 3), ("suffix", 4), ("middle", 5))]
    path = rewrite_gguf(stories, tmp_path / "fim.gguf", extra_kv=extra)
    m = Llama(model_path=str(path), n_ctx=128, verbose=False, device="cpu")
    out = m.create_completion("def f(", suffix=" return x", max_tokens=3, temperature=0)
    p = m.tokenize("def f(", add_bos=False)
    s_ids = m._exact().tokenize(" return x")
    assert m.detokenize(s_ids) == b" return x"
    assert out["usage"]["prompt_tokens"] == 1 + 1 + len(p) + 1 + len(s_ids) + 1
    m.close()
    plain = Llama(model_path=str(stories), n_ctx=128, verbose=False, device="cpu")
    out = plain.create_completion(PROMPT, suffix="THE END", max_tokens=3, temperature=0)
    assert out["choices"][0]["text"].endswith("THE END")  # no FIM tokens: appended (llama-cpp-python)
    plain.close()


def test_embeddings_pooling(stories, tmp_path, llm):
    v = llm.embed("a cat")
    assert len(v) == 64 and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
    raw = np.array(llm.embed("a cat", normalize=False))
    assert np.allclose(raw / np.linalg.norm(raw), v, atol=1e-6)
    seq = llm._embd_seq
    h = seq.hidden_states(llm.tokenize("a cat"))
    assert np.allclose(raw, h.mean(axis=0), atol=1e-5)  # mean pooling when the model names none
    many = llm.create_embedding(["a", "b c"])
    assert [d["index"] for d in many["data"]] == [0, 1] and many["usage"]["prompt_tokens"] == 2 + 3
    cls = rewrite_gguf(stories, tmp_path / "cls.gguf", extra_kv=[("llama.pooling_type", 2, GGUFValueType.UINT32)])
    m = Llama(model_path=str(cls), n_ctx=64, verbose=False, device="cpu", embedding=True)
    assert m.pooling() == "cls"
    assert np.allclose(m.embed("a cat", normalize=False), h[0], atol=1e-5)
    none = Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu", embedding=True, pooling_type=0)
    per_token = none.embed("a cat")
    assert len(per_token) == len(llm.tokenize("a cat"))
    m.close(), none.close()
    off = Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu")
    with pytest.raises(CooktopError, match="embedding=True"):
        off.embed("x")
    off.close()
    before = list(llm.input_ids)
    llm.embed("the chat context is left alone")
    assert list(llm.input_ids) == before


def test_constructor_arguments(stories, caplog):
    with caplog.at_level(logging.WARNING, logger="cooktop"):
        m = Llama(model_path=str(stories), n_ctx=64, verbose=False, device="cpu", n_threads=2, n_threads_batch=2,
                  flash_attn=True, use_mlock=True, n_ubatch=256, type_k=0, offload_kqv=True, rope_freq_base=0.0,
                  tensor_split=[1.0], main_gpu=0, use_mmap=False, numa=False, last_n_tokens_size=32,
                  made_up_arg=3)
    text = caplog.text
    for word in ("use_mlock=True", "n_ubatch=256", "use_mmap=False", "made_up_arg"):
        assert word in text
    assert "flash_attn" not in text and "type_k" not in text  # honoured (KV cache types, flash attention)
    assert m._engine.model.kv.type_k == 0 and m._engine.model.flash_attn
    assert "offload_kqv" not in text and "rope_freq_base" not in text and "numa" not in text
    assert all(len(r.getMessage().splitlines()) == 1 for r in caplog.records)
    assert m.n_ctx() == 64 and m.n_embd() == 64 and m.n_vocab() == 512 and m.last_n_tokens_size == 32
    assert m.metadata["general.architecture"] == "llama" and "tokenizer.ggml.tokens" not in m.metadata
    assert m.detokenize([m.token_nl()]) == b"\n"
    m.close()
    with pytest.raises(UnsupportedArgumentError, match="kv_overrides"):
        Llama(model_path=str(stories), verbose=False, kv_overrides={"general.name": "x"})
    with pytest.raises(CooktopError, match="x.gguf"):  # LoRA adapters load (tests/test_lora.py): a missing file
        Llama(model_path=str(stories), verbose=False, lora_path="x.gguf")
    with pytest.raises(CooktopError, match="pooling_type"):
        Llama(model_path=str(stories), verbose=False, pooling_type=9)


def test_vocab_only(stories):
    spm = SHARED / "vocab" / "ggml-vocab-llama-spm.gguf"
    m = Llama(model_path=str(spm), vocab_only=True, verbose=False)
    assert m.n_vocab() > 1000 and m.tokenize("Hello world", add_bos=False)
    assert m.detokenize(m.tokenize("Hello world", add_bos=False)).strip() == b"Hello world"
    with pytest.raises(CooktopError, match="vocab_only"):
        m.create_completion("x")
    m.close()
    with pytest.raises(CooktopError, match="is closed"):
        m.tokenize("x")


def test_save_and_load_state(llm):
    llm.reset()
    llm.create_completion(PROMPT, max_tokens=5, temperature=0)
    state = llm.save_state()
    after = llm.create_completion(" and", max_tokens=6, temperature=0)["choices"][0]["text"]
    llm.create_completion("Something else entirely", max_tokens=4, temperature=0)
    llm.load_state(state)
    assert llm.n_tokens == state.n_tokens and list(llm.input_ids) == list(state.input_ids)
    assert np.allclose(llm.scores[-1], state.scores[-1])
    assert llm.create_completion(" and", max_tokens=6, temperature=0)["choices"][0]["text"] == after
    with pytest.raises(CooktopError, match="save_state"):
        llm.load_state({"not": "a state"})


def test_from_pretrained_glob_from_cache(stories, tmp_path, monkeypatch):
    import shutil
    cache = tmp_path / "hub"
    repo = cache / "models--owner--models"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    shutil.copyfile(stories, snap / "stories260K-Q8_0.gguf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    m = Llama.from_pretrained("owner/models", "*Q8_0.gguf", cache_dir=str(cache), verbose=False, n_ctx=64,
                              device="cpu")
    assert m.model_path.endswith("stories260K-Q8_0.gguf") and str(cache) in m.model_path
    m.close()
    with pytest.raises(CooktopError, match="matches no file"):
        Llama.from_pretrained("owner/models", "*Q2_K*.gguf", cache_dir=str(cache))


def test_prompt_over_context(llm):
    with pytest.raises(ContextOverflowError, match="n_ctx = 256"):
        llm.create_completion("word " * 300)
    with pytest.raises(CooktopError, match="mirostat"):
        llm.create_completion(PROMPT, mirostat_mode=2)
