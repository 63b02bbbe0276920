"""llama-server's native ``POST /completion``: its fields, stream and errors, against the same server's
OpenAI ``/v1/completions`` (tested against llama.cpp elsewhere) for the text."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from serverutil import RunningServer

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def http(stories, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), n_parallel=2,
                                   endpoint_metrics=True))
    with httpx.Client(base_url=s.base, timeout=120) as c:
        yield c
    s.stop()


def oai_text(http, prompt, n, **kw):
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def native(http, **body):
    r = http.post("/completion", json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_fields_and_text(http):
    want = oai_text(http, PROMPT, 12)
    ids = http.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    r = native(http, prompt=PROMPT, n_predict=12, return_tokens=True)
    assert r["content"] == want
    assert r["stop"] is True and r["stop_type"] == "limit" and r["stopping_word"] == ""
    assert r["tokens_predicted"] == 12 == len(r["tokens"])
    assert r["tokens_evaluated"] == len(ids)
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["content"] == want
    assert r["has_new_line"] == ("\n" in want) and r["truncated"] is False
    assert r["id_slot"] in (0, 1) and r["index"] == 0
    assert r["generation_settings"]["n_predict"] == 12 and r["generation_settings"]["temperature"] == 0
    assert r["tokens_cached"] >= len(ids) + 11
    assert PROMPT in r["prompt"]
    assert r["timings"]["predicted_n"] == 12 and r["timings"]["prompt_n"] + r["timings"]["cache_n"] == len(ids)
    assert "completion_probabilities" not in r
    # without return_tokens, no ids (llama-server's default)
    assert native(http, prompt=PROMPT, n_predict=3)["tokens"] == []


def test_stream_is_the_same_text(http):
    whole = native(http, prompt=PROMPT, n_predict=10, return_tokens=True)
    with http.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 10, "temperature": 0,
                                                   "stream": True}) as r:  # a partial carries its token anyway
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and "data: [DONE]" not in lines
    events = [json.loads(line[6:]) for line in lines]
    *parts, last = events
    assert all(p["stop"] is False for p in parts) and last["stop"] is True
    assert "".join(p["content"] for p in parts) == whole["content"]
    assert [t for p in parts for t in p["tokens"]] == whole["tokens"]
    assert [p["tokens_predicted"] for p in parts if p["tokens"]] == list(range(1, 11))
    assert last["content"] == "" and last["tokens"] == [] and last["tokens_predicted"] == 10
    assert last["stop_type"] == "limit" and "timings" in last


def test_token_and_mixed_prompts(http):
    ids = http.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    tail = http.post("/tokenize", json={"content": " there"}).json()["tokens"]
    by_ids = native(http, prompt=ids + tail, n_predict=8)
    mixed = native(http, prompt=[PROMPT, *tail], n_predict=8)
    assert mixed["content"] == by_ids["content"] == oai_text(http, ids + tail, 8)
    assert mixed["tokens_evaluated"] == by_ids["tokens_evaluated"] == len(ids) + len(tail)
    # a list of prompts: one result each, in order
    both = http.post("/completion", json={"prompt": [PROMPT, "The dog"], "n_predict": 4, "temperature": 0}).json()
    assert [b["index"] for b in both] == [0, 1]
    assert both[0]["content"] == native(http, prompt=PROMPT, n_predict=4)["content"]
    assert both[1]["content"] == oai_text(http, "The dog", 4)


def test_stop_word(http):
    text = native(http, prompt=PROMPT, n_predict=16)["content"]
    word = text.split()[2]
    r = native(http, prompt=PROMPT, n_predict=16, stop=[word])
    assert r["stop_type"] == "word" and r["stopping_word"] == word
    assert r["content"] == text[:text.index(word)]
    assert r["tokens_predicted"] < 16


def test_n_probs(http):
    r = native(http, prompt=PROMPT, n_predict=5, n_probs=3, return_tokens=True)
    probs = r["completion_probabilities"]
    assert len(probs) == 5
    for tok, p in zip(r["tokens"], probs):
        assert p["id"] == tok and len(p["top_logprobs"]) == 3
        tops = [t["logprob"] for t in p["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and sum(math.exp(t) for t in tops) <= 1.0 + 1e-5
        assert p["top_logprobs"][0]["id"] == tok and p["logprob"] == tops[0]  # greedy: the most probable
        assert bytes(p["bytes"]).decode("utf-8", "ignore") == p["token"]


def test_post_sampling_probs_are_the_sampler_chains(http):
    """With ``post_sampling_probs`` the probabilities are those top_k and temperature leave, renormalised
    (``prob`` / ``top_probs``), the same tokens drawn as without it (same seed): the raw logprobs of the
    top_k=2 candidates give them, p_i = exp(lp_i / T) / sum_j exp(lp_j / T)."""
    T = 0.7
    body = dict(prompt=PROMPT, n_predict=6, n_probs=3, top_k=2, top_p=1.0, min_p=0.0, temperature=T, seed=11,
                return_tokens=True)
    raw = native(http, **body)
    post = native(http, **body, post_sampling_probs=True)
    assert post["tokens"] == raw["tokens"] and post["generation_settings"]["post_sampling_probs"] is True
    for tok, r, p in zip(post["tokens"], raw["completion_probabilities"], post["completion_probabilities"]):
        assert set(p) == {"id", "token", "bytes", "prob", "top_probs"} and p["id"] == tok
        assert len(p["top_probs"]) == 2 and all(set(t) == {"id", "token", "bytes", "prob"} for t in p["top_probs"])
        lps = [t["logprob"] for t in r["top_logprobs"][:2]]
        want = np.exp(np.array(lps) / T)
        want /= want.sum()
        assert [t["id"] for t in p["top_probs"]] == [t["id"] for t in r["top_logprobs"][:2]]
        assert np.allclose([t["prob"] for t in p["top_probs"]], want, atol=1e-5)
        assert p["prob"] == next(t["prob"] for t in p["top_probs"] if t["id"] == tok)


def test_post_sampling_probs_greedy_and_streamed(http):
    """Greedy: the chosen token alone, probability 1 (llama.cpp's temperature sampler leaves the rest at
    -inf, and zeros are left out); a stream carries each token's entry in its partial result."""
    r = native(http, prompt=PROMPT, n_predict=3, n_probs=5, post_sampling_probs=True, return_tokens=True)
    for tok, p in zip(r["tokens"], r["completion_probabilities"]):
        assert p["prob"] == 1.0 and p["top_probs"] == [{k: p[k] for k in ("id", "token", "bytes", "prob")}]
        assert p["id"] == tok
    with http.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 5,
                                                   "post_sampling_probs": True, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line]
    streamed = [e["completion_probabilities"][0] for e in events if "completion_probabilities" in e]
    assert streamed == r["completion_probabilities"]


def test_post_sampling_probs_on_chat(http):
    """/v1/chat/completions takes it too (llama-server's logprobs.content then has ``prob`` / ``top_probs``),
    streamed and not, the same values the raw logprobs give after top_k=2 and the temperature."""
    T = 0.5
    body = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=5, logprobs=True, top_logprobs=3, top_k=2,
                top_p=1.0, min_p=0.0, temperature=T, seed=3)
    raw = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    r = http.post("/v1/chat/completions", json={**body, "post_sampling_probs": True})
    assert r.status_code == 200, r.text
    post = r.json()["choices"][0]["logprobs"]["content"]
    assert len(post) == len(raw) > 0
    for a, b in zip(raw, post):
        assert set(b) == {"token", "bytes", "prob", "top_probs"} and b["token"] == a["token"]
        want = np.exp(np.array([t["logprob"] for t in a["top_logprobs"][:2]]) / T)
        assert np.allclose([t["prob"] for t in b["top_probs"]], want / want.sum(), atol=1e-5)
    with http.stream("POST", "/v1/chat/completions", json={**body, "post_sampling_probs": True, "stream": True}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line and line != "data: [DONE]"]
    streamed = [e for c in chunks for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    assert streamed == post
    r = http.post("/v1/chat/completions", json={**body, "post_sampling_probs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "post_sampling_probs"
    r = http.post("/v1/completions", json={"prompt": PROMPT, "logprobs": 2, "post_sampling_probs": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "post_sampling_probs"


def test_n_cmpl_several_completions_of_a_prompt(http):
    """``n_cmpl`` (alias ``n``): an array of results, ``index`` counting prompt 0's completions first; the
    k-th one is sampled with seed + k (llama-server's child tasks), so it is the request with that seed."""
    body = dict(n_predict=6, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, return_tokens=True)
    rs = native(http, prompt=[PROMPT, "The cat"], n_cmpl=2, seed=5, **body)
    assert [r["index"] for r in rs] == [0, 1, 2, 3]
    for r, (prompt, seed) in zip(rs, [(PROMPT, 5), (PROMPT, 6), ("The cat", 5), ("The cat", 6)]):
        one = native(http, prompt=prompt, seed=seed, **body)
        assert r["tokens"] == one["tokens"] and r["content"] == one["content"]
        assert r["generation_settings"]["seed"] == seed
    assert rs[0]["tokens"] != rs[1]["tokens"]
    assert [r["index"] for r in native(http, prompt=PROMPT, n=2, seed=5, **body)] == [0, 1]
    assert isinstance(native(http, prompt=PROMPT, n_cmpl=1, n_predict=1), dict)  # one result: no array
    with http.stream("POST", "/completion", json={"prompt": PROMPT, "n_cmpl": 2, "seed": 5, "stream": True,
                                                   **body}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line]
    for i in (0, 1):
        mine = [e for e in events if e["index"] == i]
        assert mine[-1]["stop"] is True and [t for e in mine for t in e["tokens"]] == rs[i]["tokens"]


@pytest.mark.parametrize("body, param", [
    ({"n_cmpl": 3}, "n_cmpl"), ({"n_cmpl": 0}, "n_cmpl"), ({"n": "2"}, "n"), ({"n": 9}, "n"),
])
def test_bad_n_cmpl_is_400(http, body, param):
    r = http.post("/completion", json={"prompt": PROMPT, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def predicted_total(http):
    line = next(x for x in http.get("/metrics").text.splitlines() if x.startswith("llamacpp:tokens_predicted_total"))
    return float(line.split()[1])


def test_response_fields(http):
    before = predicted_total(http)
    r = native(http, prompt=PROMPT, n_predict=2, response_fields=["content", "generation_settings/n_predict",
                                                                    "no/such"])
    assert set(r) == {"content", "generation_settings/n_predict"} and r["generation_settings/n_predict"] == 2
    assert predicted_total(http) == before + 2  # counted though the answer leaves its timings out


def test_context_full_is_truncated_and_a_full_prompt_refused(http):
    """llama-server: a generation that fills the context is ``truncated`` (stop_type limit); a prompt that
    leaves no room (n_tokens >= n_ctx) is a 400."""
    r = native(http, prompt=PROMPT, n_predict=-1, ignore_eos=True)
    assert r["stop_type"] == "limit" and r["truncated"] is True and r["tokens_cached"] == 256
    assert native(http, prompt=PROMPT, n_predict=3)["truncated"] is False
    ids = http.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    full = ids + [ids[-1]] * (256 - len(ids))
    r = http.post("/completion", json={"prompt": full, "n_predict": 2})
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error", r.text


@pytest.mark.parametrize("body, param", [
    ({"prompt": PROMPT, "n_probs": 2, "post_sampling_probs": "yes"}, "post_sampling_probs"),
    ({"prompt": {"a": 1}}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": PROMPT, "n_probs": -1}, "n_probs"),
    ({"prompt": PROMPT, "response_fields": "content"}, "response_fields"),
    ({"prompt": PROMPT, "temperature": "hot"}, "temperature"),
    ({"prompt": PROMPT, "n_predict": -5}, "n_predict"),
])
def test_bad_requests_are_400_naming_the_field(http, body, param):
    r = http.post("/completion", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_prompt_over_the_context_is_a_clear_400(http):
    r = http.post("/completion", json={"prompt": "word " * 400, "n_predict": 1})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]


def test_infill_without_fim_tokens_is_501(http):
    r = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": "return x"})
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    assert err["type"] == "not_supported_error" and "prefix token is missing" in err["message"]


def test_infill_layout(stories, tmp_path, server_deps):
    """``/infill`` on a model with FIM tokens: [extra chunks] [BOS] <PRE> prefix prompt <SUF> suffix <MID>
    (llama-server's format_prompt_infill; no repo/file-separator tokens here, so chunks go after a
    snippet line), the prefix cut to its last 3/4 of a batch; the text that of ``/completion`` on
    those ids."""
    import httpx
    from conftest import rewrite_gguf
    from gguf import GGUFValueType

    from cooktop.server.app import ServerConfig
    extra = [(f"tokenizer.ggml.{k}_token_id", v, GGUFValueType.UINT32) for k, v in
             (("prefix", 3), ("suffix", 4), ("middle", 5))]
    path = rewrite_gguf(stories, tmp_path / "fim.gguf", extra_kv=extra)
    s = RunningServer(ServerConfig(str(path), llama_kwargs=dict(n_ctx=256, n_batch=64, device="cpu")))
    try:
        with httpx.Client(base_url=s.base, timeout=120) as c:
            def tok(text):
                return c.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]

            pre, suf, prompt = tok("Once upon a"), tok(" the end."), tok(" time")
            snippet = tok("\n\n--- snippet ---\n\n") + tok("Lily had a cat.")
            body = {"input_prefix": "Once upon a", "input_suffix": " the end.", "prompt": " time",
                    "input_extra": [{"filename": "a.txt", "text": "Lily had a cat."}], "n_predict": 6,
                    "temperature": 0, "return_tokens": True}
            r = c.post("/infill", json=body)
            assert r.status_code == 200, r.text
            ids = snippet + [1, 3, *pre, *prompt, 4, *suf, 5]
            assert r.json()["tokens_evaluated"] == len(ids)
            want = c.post("/completion", json={"prompt": ids, "n_predict": 6, "temperature": 0,
                                               "return_tokens": True}).json()
            assert r.json()["tokens"] == want["tokens"] and r.json()["content"] == want["content"]
            long_prefix = " ".join(["the cat sat"] * 30)
            r = c.post("/infill", json={"input_prefix": long_prefix, "input_suffix": "", "n_predict": 1})
            assert r.json()["tokens_evaluated"] == 1 + 1 + 48 + 1 + 1  # BOS <PRE> last 48 <SUF> <MID>
            for bad, param in (({"input_suffix": ""}, "input_prefix"),
                               ({"input_prefix": "", "input_suffix": "", "prompt": 5}, "prompt"),
                               ({"input_prefix": "", "input_suffix": "", "input_extra": [{"file": 1}]},
                                "input_extra")):
                r = c.post("/infill", json=bad)
                assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    finally:
        s.stop()


def test_slot_save_erase_restore(stories, tmp_path, server_deps):
    """save, erase, restore: the continuation is the one without erasing, its prompt read from the
    restored cache; a file of another model, a foreign file and a path are refused by name."""
    import httpx

    from cooktop.server.app import ServerConfig
    saved = tmp_path / "slots"
    saved.mkdir()
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), n_parallel=2,
                                   slot_save_path=str(saved), endpoint_props=True))
    try:
        with httpx.Client(base_url=s.base, timeout=120) as c:
            assert c.post("/props", json={}).json() == {"success": True}  # --props
            first = native(c, prompt=PROMPT, n_predict=8, id_slot=1)
            convo = PROMPT + first["content"]
            want = native(c, prompt=convo, n_predict=8, id_slot=0, cache_prompt=False)["content"]
            r = c.post("/slots/1?action=save", json={"filename": "one.slot"})
            assert r.status_code == 200, r.text
            n_saved = r.json()["n_saved"]
            assert r.json()["id_slot"] == 1 and n_saved == first["tokens_cached"] > 0
            assert r.json()["n_written"] == (saved / "one.slot").stat().st_size
            assert c.post("/slots/1?action=erase").json()["n_erased"] == n_saved
            r = c.post("/slots/1?action=restore", json={"filename": "one.slot"})
            assert r.status_code == 200, r.text
            assert r.json()["n_restored"] == n_saved and r.json()["n_read"] == (saved / "one.slot").stat().st_size
            slot1 = next(x for x in c.get("/slots").json() if x["id"] == 1)
            assert slot1["n_prompt_tokens"] == n_saved
            again = native(c, prompt=convo, n_predict=8, id_slot=1)
            assert again["content"] == want
            assert again["timings"]["cache_n"] >= n_saved - 1  # read from the restored cells, not evaluated
            doc = json.loads((saved / "one.slot").read_text())
            doc["model"]["n_vocab"] += 1
            (saved / "other.slot").write_text(json.dumps(doc))
            (saved / "llama.bin").write_bytes(b"GGSQ\x00\x01binary")
            (saved / "deep.slot").write_text("[" * 100000 + "]" * 100000)
            for name, words in (("other.slot", "another model"), ("llama.bin", "not a cooktop slot file"),
                                ("deep.slot", "not a cooktop slot file"),
                                ("missing.slot", "no slot file")):
                r = c.post("/slots/0?action=restore", json={"filename": name})
                assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
            for name in ("../x", "a/b", "..", "", None):
                r = c.post("/slots/0?action=save", json={"filename": name})
                assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid filename"
            assert not (tmp_path / "x").exists()
    finally:
        s.stop()


def test_native_embedding(http):
    want = http.post("/v1/embeddings", json={"input": "a cat"}).json()["data"][0]["embedding"]
    r = http.post("/embedding", json={"content": "a cat"})
    assert r.status_code == 200, r.text
    (res,) = r.json()
    assert res["index"] == 0 and len(res["embedding"]) == 1
    assert np.allclose(res["embedding"][0], want, atol=1e-6)
    raw = np.array(http.post("/embeddings", json={"input": "a cat", "embd_normalize": -1}).json()[0]["embedding"][0])
    assert np.allclose(raw / np.linalg.norm(raw), want, atol=1e-6) and not np.isclose(np.linalg.norm(raw), 1.0)
    taxi = np.array(http.post("/embedding", json={"content": "a cat", "embd_normalize": 1}).json()[0]["embedding"][0])
    assert abs(np.abs(taxi).sum() - 1.0) < 1e-5
    maxabs = np.array(http.post("/embedding", json={"content": "a cat", "embd_normalize": 0}).json()[0]["embedding"][0])
    assert abs(np.abs(maxabs).max() - 32760.0) < 0.1
    two = http.post("/embedding", json={"content": ["a cat", "a dog sat"]}).json()
    assert [t["index"] for t in two] == [0, 1] and np.allclose(two[0]["embedding"][0], want, atol=1e-6)
    for body in ({}, {"content": []}, {"content": {"a": 1}}, {"content": "a cat", "embd_normalize": "x"}):
        assert http.post("/embedding", json=body).status_code == 400


def test_native_embedding_per_token_with_pooling_none(stories, server_deps, http):
    import httpx

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=128, device="cpu", pooling_type=0)))
    try:
        with httpx.Client(base_url=s.base, timeout=120) as c:
            ids = c.post("/tokenize", json={"content": "a cat sat", "add_special": True}).json()["tokens"]
            (res,) = c.post("/embedding", json={"content": "a cat sat"}).json()
            assert len(res["embedding"]) == len(ids) and all(len(v) == 64 for v in res["embedding"])
            # the rows mean pooling averages (the module's server pools by mean), not normalised
            pooled = http.post("/embedding", json={"content": "a cat sat", "embd_normalize": -1}).json()
            assert np.allclose(np.mean(np.array(res["embedding"]), axis=0), pooled[0]["embedding"][0], atol=1e-5)
            r = c.post("/v1/embeddings", json={"input": "a cat"})
            assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_completions_without_v1_is_native(http):
    """llama-server routes /completions to its native handler (OpenAI's is /v1/completions)."""
    r = http.post("/completions", json={"prompt": PROMPT, "n_predict": 3, "temperature": 0}).json()
    assert r["stop"] is True and r["content"] == native(http, prompt=PROMPT, n_predict=3)["content"]


def test_post_props_needs_the_flag(http):
    r = http.post("/props", json={})
    assert r.status_code == 501 and "--props" in r.json()["error"]["message"]


def test_metrics_count_the_answers_timings(http):
    """llama-server's /metrics counters move by what each answer's timings say: prompt tokens
    evaluated, those read from the cache, tokens predicted, the longest sequence."""
    def metrics():
        out = {}
        for line in http.get("/metrics").text.splitlines():
            if line.startswith("llamacpp:"):
                name, value = line.split()
                out[name[len("llamacpp:"):]] = float(value)
        return out

    before = metrics()
    for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total",
                 "tokens_predicted_seconds_total", "n_tokens_max", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "prompt_tokens_seconds", "predicted_tokens_seconds",
                 "requests_processing", "requests_deferred"):
        assert name in before, name
    a = native(http, prompt=PROMPT + " a cat", n_predict=5)["timings"]
    b = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                                "temperature": 0}).json()["timings"]
    after = metrics()
    for key, field in (("prompt_tokens_total", "prompt_n"), ("prompt_tokens_cached_total", "cache_n"),
                       ("tokens_predicted_total", "predicted_n")):
        assert after[key] - before[key] == a[field] + b[field], key
    assert after["n_tokens_max"] >= a["cache_n"] + a["prompt_n"] + a["predicted_n"]
    assert after["tokens_predicted_seconds_total"] > before["tokens_predicted_seconds_total"]


def test_logit_bias_by_text_and_false(http):
    """llama-server's logit_bias: [[text, bias]] and {"text": bias} bias each token of the text, false is
    -inf, ids outside the vocabulary are dropped (server-task.cpp params_from_json_cmpl)."""
    first = native(http, prompt=PROMPT, n_predict=1, return_tokens=True)
    tok = first["tokens"][0]
    piece = http.post("/detokenize", json={"tokens": [tok]}).json()["content"]
    ids = http.post("/tokenize", json={"content": piece}).json()["tokens"]
    assert tok in ids, (piece, ids)  # the text's tokens (SPM: after a space token) hold the greedy one
    for bias in ([[piece, False]], {piece: -100}, [[tok, False]], {str(tok): False, "99999": 5}):
        r = native(http, prompt=PROMPT, n_predict=1, return_tokens=True, logit_bias=bias)
        assert r["tokens"][0] != tok, bias
    chat = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "temperature": 0,
                                              "logit_bias": [[piece, False]]}).json()
    assert chat["choices"][0]["text"] != piece


def test_fim_tokens_found_as_llama_cpp_finds_them(shared):
    """token_prefix / suffix / middle (and so /infill) find a vocabulary's FIM tokens by the fim_* keys or by
    their text (StarCoder's <fim_prefix>...), as llama.cpp's llama_vocab_fim_pre does."""
    from cooktop.api import Llama
    v = Llama(model_path=str(shared / "vocab" / "ggml-vocab-starcoder.gguf"), vocab_only=True, verbose=False)
    ids = v.tokenize(b"<fim_prefix><fim_suffix><fim_middle>", add_bos=False, special=True)
    assert [v.token_prefix(), v.token_suffix(), v.token_middle()] == ids and len(ids) == 3


def test_json_prompt_and_multimodal_refusal(http):
    """llama-server's JSON prompt ``{"prompt_string": ...}`` is that string; with ``multimodal_data`` a 400
    (no --mmproj), alone or in a list of prompts."""
    want = native(http, prompt=PROMPT, n_predict=4)["content"]
    assert native(http, prompt={"prompt_string": PROMPT}, n_predict=4)["content"] == want
    both = http.post("/completion", json={"prompt": [PROMPT, {"prompt_string": PROMPT}], "n_predict": 4,
                                          "temperature": 0}).json()
    assert [r["content"] for r in both] == [want, want]
    for bad in ({"prompt_string": PROMPT, "multimodal_data": ["aGk="]}, {"text": PROMPT}):
        r = http.post("/completion", json={"prompt": bad, "n_predict": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_collect_cancels_when_the_client_leaves():
    """A non-streamed answer stops reading its job once the client is gone (llama-server cancels the task)."""
    import asyncio

    from cooktop.server.bridge import Bridge, ClientGone
    closed = []

    class Gone:
        async def is_disconnected(self):
            return True

    async def slow():
        try:
            yield 1
            await asyncio.sleep(60)
            yield 2
        finally:
            closed.append(True)

    bridge = Bridge(None, None, None, None, None)
    with pytest.raises(ClientGone):
        asyncio.run(bridge.collect(Gone(), slow()))
    assert closed == [True]


TEMPLATE = ("{{ bos_token }}[{{ date_string }}|{{ datetime }}|{{ enable_thinking | default('unset') }}]"
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_apply_template_context_and_reasoning_flag(stories, tmp_path, server_deps):
    """llama-server's template context: today's ``date_string`` / ``datetime``, ``--reasoning off`` as
    ``enable_thinking`` (a request's ``chat_template_kwargs`` over it), ``add_generation_prompt`` honoured."""
    import datetime

    import httpx

    from cooktop.cli.serve import _template_kwargs
    from cooktop.errors import CooktopError
    from cooktop.server.app import ServerConfig
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    kw = dict(n_ctx=64, device="cpu", chat_template_file=str(path))
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=kw, template_kwargs=_template_kwargs("off", None)))
    try:
        now = datetime.datetime.now()
        day = f"{now:%d %b %Y}|{now:%b %d %Y}"
        msgs = [{"role": "user", "content": "hi"}]
        r = httpx.post(s.base + "/apply-template", json={"messages": msgs}).json()
        assert r["prompt"].endswith(f"[{day}|False]<user>hi<assistant>")
        r = httpx.post(s.base + "/apply-template", json={"messages": msgs, "add_generation_prompt": False,
                                                         "chat_template_kwargs": {"enable_thinking": True}}).json()
        assert r["prompt"].endswith(f"[{day}|True]<user>hi")
    finally:
        s.stop()
    assert _template_kwargs("on", '{"x": 1}') == {"x": 1, "enable_thinking": True}
    assert _template_kwargs("auto", None) == {"enable_thinking": True}  # llama-server passes it to every template
    assert _template_kwargs("auto", '{"enable_thinking": false}') == {"enable_thinking": False}
    for bad, why in ((("maybe", None), "unknown value for --reasoning"), (("auto", "[1]"), "a JSON object"),
                     (("auto", "{"), "not JSON")):
        with pytest.raises(CooktopError, match=why):
            _template_kwargs(*bad)
