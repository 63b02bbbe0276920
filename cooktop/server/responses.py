"""Server responses: jobs making n choices, non-streamed answers assembled from their stream, metrics text.

A non-streamed answer is built from exactly the chunks a stream would carry,
so the two can never differ.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..api.chat_plan import assemble_message
from ..version import __version__

#: OpenAI's ``system_fingerprint`` of every completion the server answers, in llama-server's shape
#: (``b<build>-<source>``: tools/server/server-task.cpp ``build_info``), cooktop's version as the build
SYSTEM_FINGERPRINT = f"b{__version__}-cooktop"


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any]) -> dict[str, Any]:
    """The sum of two usages (the jobs below count each prompt once: see :func:`repeat_usage`)."""
    if total is None:
        return dict(usage)
    out = {k: total[k] + usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    cached = [u.get("prompt_tokens_details", {}).get("cached_tokens") for u in (total, usage)]
    if any(c is not None for c in cached):
        out["prompt_tokens_details"] = {"cached_tokens": sum(c or 0 for c in cached)}
    return out


def repeat_usage(chunk: dict[str, Any]) -> dict[str, Any]:
    """``chunk`` of a further choice of the same prompt: its usage counts no prompt tokens."""
    u = chunk.get("usage")
    if u:
        chunk["usage"] = {"prompt_tokens": 0, "completion_tokens": u["completion_tokens"],
                          "total_tokens": u["completion_tokens"], "prompt_tokens_details": {"cached_tokens": 0}}
    return chunk


def prompt_options(kw: dict[str, Any]) -> dict[str, bool]:
    """The rendering options of chat arguments (``protocol.continuation``) for ``Llama.chat_prompt``."""
    return {k: kw[k] for k in ("add_generation_prompt", "continue_final_message") if k in kw}


def empty_chat(llm: Any, kw: dict[str, Any]):
    """The chunks of a chat answer of no tokens (``max_tokens: 0``, as llama-server answers it):
    the role, then ``finish_reason`` "length" with the prompt's usage.

    Raises:
        ChatTemplateError / ContextOverflowError: as ``create_chat_completion``.
    """
    tokens, _stops = llm.chat_prompt(kw["messages"], kw.get("tools"), **prompt_options(kw))
    llm._engine.check_prompt(tokens)
    base = {"id": f"chatcmpl-{uuid.uuid4()}", "object": "chat.completion.chunk", "created": int(time.time()),
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "model": kw["model"]}
    yield dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None}])
    yield dict(base, choices=[{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}],
               usage={"prompt_tokens": len(tokens), "completion_tokens": 0, "total_tokens": len(tokens),
                      "prompt_tokens_details": {"cached_tokens": 0}})


def timings_json(t: Any, cached: int) -> dict[str, Any]:
    """llama-server's ``timings`` of one generation (tools/server/server-common.cpp
    ``server_slot_stats::to_json``) from a :class:`~cooktop.engine.generate.Timings` (ms) and its
    ``cached`` prompt tokens; ``draft_n`` / ``draft_n_accepted`` only when tokens were drafted. The
    generation rates are over ``predicted_n - 1`` decode steps: the first token comes from the prompt's
    last batch (server-common.h ``n_gen_steps``)."""
    def per(ms: float, n: int) -> tuple[float, float]:
        return (ms / n if n else 0.0), (1e3 * n / ms if ms > 0 else 0.0)

    predicted_ms = t.eval_ms + t.sample_ms
    p_tok, p_sec = per(t.prompt_ms, t.prompt_n)
    g_tok, g_sec = per(predicted_ms, max(t.n_decoded - 1, 0))
    out = {"cache_n": cached, "prompt_n": t.prompt_n, "prompt_ms": t.prompt_ms, "prompt_per_token_ms": p_tok,
           "prompt_per_second": p_sec, "predicted_n": t.n_decoded, "predicted_ms": predicted_ms,
           "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec}
    if t.n_drafted:
        out["draft_n"], out["draft_n_accepted"] = t.n_drafted, t.n_accepted
    return out


def verbose_json(llm: Any, res: Any, final: dict[str, Any], model: str) -> dict[str, Any]:
    """llama-server's ``__verbose`` object of one finished generation (tools/server/server-task.cpp
    ``server_task_result_cmpl_final::to_json_non_oaicompat``) from its
    :class:`~cooktop.engine.generate.GenerationResult` and ``final`` chunk: ``prompt`` is the prompt's
    tokens as text with the special tokens (``detokenize(..., special=True)``), ``tokens_cached`` the
    tokens the slot then holds (the last one sampled is not evaluated)."""
    word = final.get("stopping_word") or ""
    text = res.text
    cached = ((final.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return {"index": 0, "content": text, "tokens": [], "id_slot": -1, "stop": True, "model": model,
            "tokens_predicted": len(res.tokens), "tokens_evaluated": len(res.prompt),
            "prompt": llm.detokenize(res.prompt, special=True).decode("utf-8", "replace"),
            "has_new_line": "\n" in text, "truncated": False,
            "stop_type": "limit" if res.finish_reason == "length" else "word" if word else "eos",
            "stopping_word": word, "tokens_cached": max(len(res.prompt) + len(res.tokens) - 1, 0),
            "timings": timings_json(res.timings, cached)}


def with_timings(llm: Any, chunks: Any, verbose: bool = False, model: str = ""):
    """``chunks`` of one choice, the last (``finish_reason`` set) held back until the generation has
    finished and then sent with its ``timings`` (llama-server's last chunk carries them), and with
    ``verbose`` its ``__verbose`` (:func:`verbose_json`). Reads the result this thread's completion left
    (``Llama._last_here``); none (``max_tokens: 0``): neither."""
    before = llm._last_here()
    held = None
    for chunk in chunks:
        if held is not None:
            yield held
            held = None
        if chunk["choices"] and chunk["choices"][0].get("finish_reason") is not None:
            held = chunk
        else:
            yield chunk
    if held is not None:
        res = llm._last_here()
        if res is not None and res is not before:
            cached = ((held.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            held["timings"] = timings_json(res.timings, cached or 0)
            if verbose:
                held["__verbose"] = verbose_json(llm, res, held, model)
        yield held


class TimingsSum:
    """The ``timings`` of a request making several choices (``n`` > 1, a list of prompts), summed
    to agree with its usage: ``predicted_n`` (and ``draft_n`` / ``draft_n_accepted``) over every
    choice; ``prompt_n`` and ``cache_n`` over the first choice of each prompt (its usage counts a
    prompt once, and a further choice of it reads it from the cache); ``prompt_ms`` and
    ``predicted_ms`` over every choice (they run one after the other: the request's wall time in
    each phase); the per-token and per-second figures derived from those sums."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def add(self, t: dict[str, Any], repeat: bool) -> None:
        """Count ``t`` (one choice's :func:`timings_json`); ``repeat``: a further choice of a prompt."""
        keys = ["prompt_ms", "predicted_ms", "predicted_n", "draft_n", "draft_n_accepted"]
        keys += [] if repeat else ["prompt_n", "cache_n"]
        for k in keys:
            if k in t:
                self.sums[k] = self.sums.get(k, 0) + t[k]
        self.sums["steps"] = self.sums.get("steps", 0) + max(t.get("predicted_n", 0) - 1, 0)  # first one free

    def json(self) -> dict[str, Any]:
        """llama-server's ``timings`` fields of the sums (ms; counts)."""
        g = self.sums.get

        def per(ms: float, n: float) -> tuple[float, float]:
            return (ms / n if n else 0.0), (1e3 * n / ms if ms > 0 else 0.0)

        p_tok, p_sec = per(g("prompt_ms", 0.0), g("prompt_n", 0))
        g_tok, g_sec = per(g("predicted_ms", 0.0), g("steps", 0))
        out = {"cache_n": g("cache_n", 0), "prompt_n": g("prompt_n", 0), "prompt_ms": g("prompt_ms", 0.0),
               "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec, "predicted_n": g("predicted_n", 0),
               "predicted_ms": g("predicted_ms", 0.0), "predicted_per_token_ms": g_tok,
               "predicted_per_second": g_sec}
        if "draft_n" in self.sums:
            out["draft_n"], out["draft_n_accepted"] = g("draft_n", 0), g("draft_n_accepted", 0)
        return out


def summed_timings(chunks: Any, acc: TimingsSum, repeat: bool, last: bool):
    """``chunks`` of one choice with its ``timings`` counted in ``acc``; only the ``last`` choice's
    finish chunk keeps them, replaced by the request's sums."""
    for chunk in chunks:
        t = chunk.pop("timings", None)
        if t is not None:
            acc.add(t, repeat)
            if last:
                chunk["timings"] = acc.json()
        yield chunk


def eos_ignored(llm: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` without its ``ignore_eos`` (llama-server's field), which becomes a -inf
    ``logit_bias`` on the model's end-of-generation tokens."""
    if kw.pop("ignore_eos", False):
        bias = kw.get("logit_bias")
        kw["logit_bias"] = {**(bias if isinstance(bias, dict) else {}),
                            **{str(t): float("-inf") for t in llm._tokenizer.eog_ids}}
    return kw


def choices_job(n: int, args: dict[str, Any], call, model: str, verbose: bool = False):
    """A job making ``n`` streamed choices one after the other (choice i: seed + i); ``verbose``: each
    choice's last chunk carries llama-server's ``__verbose`` (:func:`verbose_json`)."""
    def make(llm):
        def gen():
            acc = TimingsSum()
            for i in range(n):
                kw = eos_ignored(llm, dict(args, stream=True, model=model))
                if n > 1 and kw.get("seed") is not None:
                    kw["seed"] = kw["seed"] + i
                chunks = with_timings(llm, call(llm, kw), verbose, model)
                for chunk in summed_timings(chunks, acc, i > 0, i == n - 1):
                    if "__verbose" in chunk:
                        chunk["__verbose"]["index"] = i
                    chunk["choices"][0]["index"] = i
                    chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
                    yield repeat_usage(chunk) if i else chunk
        return gen()
    return make


def prompt_choices_job(prompts: list[Any], n: int, args: dict[str, Any], model: str, verbose: bool = False):
    """A job for ``/v1/completions``: ``n`` choices per prompt, indexed prompt-major as OpenAI does
    (``verbose``: as :func:`choices_job`)."""
    def make(llm):
        def gen():
            idx, acc = 0, TimingsSum()
            for prompt in prompts:
                for i in range(n):
                    kw = eos_ignored(llm, dict(args, stream=True, model=model))
                    if n > 1 and kw.get("seed") is not None:
                        kw["seed"] = kw["seed"] + i
                    chunks = with_timings(llm, llm.create_completion(prompt, **kw), verbose, model)
                    for chunk in summed_timings(chunks, acc, i > 0, idx == len(prompts) * n - 1):
                        if "__verbose" in chunk:
                            chunk["__verbose"]["index"] = idx
                        chunk["choices"][0]["index"] = idx
                        chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
                        yield repeat_usage(chunk) if i else chunk
                    idx += 1
        return gen()
    return make


def assemble_chat(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``chat.completion`` from its stream (the same text the stream carries)."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for c in chunks:
        ch = c["choices"][0]
        slot = choices.setdefault(ch["index"], {"text": [], "finish": None, "lp": None})
        slot["text"].append(ch["delta"])
        if ch.get("logprobs") is not None:
            slot["lp"] = (slot["lp"] or []) + ch["logprobs"]["content"]
        if ch["finish_reason"] is not None:
            slot["finish"] = ch["finish_reason"]
        if c.get("usage"):
            usage = add_usage(usage, c["usage"])
    first = chunks[0]
    return with_last_timings(chunks, {
        "id": first["id"], "object": "chat.completion", "created": first["created"], "model": first["model"],
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [{"index": i, "message": assemble_message(s["text"]),
                     "logprobs": None if s["lp"] is None else {"content": s["lp"], "refusal": None},
                     "finish_reason": s["finish"]} for i, s in sorted(choices.items())],
        "usage": usage})


def assemble_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``text_completion`` from its stream."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for c in chunks:
        ch = c["choices"][0]
        slot = choices.setdefault(ch["index"], {"text": [], "finish": None, "lp": None})
        slot["text"].append(ch["text"])
        lp = ch.get("logprobs")
        if lp is not None:
            if slot["lp"] is None:
                slot["lp"] = {k: [] for k in lp}
            for k in lp:
                slot["lp"][k] += lp[k]
        if ch["finish_reason"] is not None:
            slot["finish"] = ch["finish_reason"]
        if c.get("usage"):
            usage = add_usage(usage, c["usage"])
    first = chunks[0]
    return with_last_timings(chunks, {
        "id": first["id"], "object": "text_completion", "created": first["created"], "model": first["model"],
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [{"index": i, "text": "".join(s["text"]), "logprobs": s["lp"], "finish_reason": s["finish"]}
                    for i, s in sorted(choices.items())],
        "usage": usage})


def with_last_timings(chunks: list[dict[str, Any]], answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with the ``timings`` of the last chunk that has them (the request's sums), if any,
    and likewise its ``__verbose``."""
    for key in ("timings", "__verbose"):
        for c in reversed(chunks):
            if key in c:
                answer[key] = c[key]
                break
    return answer


def prometheus(state: Any) -> str:
    """Prometheus text exposition of the server's counters: llama-server's ``llamacpp:*`` metrics
    (tools/server/server-task.cpp ``server_task_result_metrics::to_metrics``; its throughput gauges
    over the whole run, not since the last scrape; ``n_decode_total`` counts the target model's passes;
    not its ``spec_decode_num_drafts_total``), then cooktop's own. Asleep (``state.scheduler`` None), the
    counters kept in ``state.metrics`` and idle gauges (the pass counts are the reloaded model's after a
    wake)."""
    s = state.scheduler
    model = getattr(getattr(state.llm, "_engine", None), "model", None)  # None asleep
    if model is not None:
        state.decodes = (model.n_decode, model.n_seq_decode)  # kept for the sleeping server's scrapes
    n_decode, n_seq_decode = getattr(state, "decodes", (0, 0))
    if s is None:  # asleep (``--sleep-idle-seconds``): the counters of before, nothing running
        m, busy, waiting, n_slots, tps = state.metrics, 0, 0, state.config.n_parallel, 0.0
        n_seqs, n_tokens = 0, 0
    else:
        m, busy, waiting, n_slots, tps = s.metrics, s.busy, s.queue_depth, len(s.slots), s.tokens_per_second()
        n_seqs, n_tokens = s.batch_size()

    def rate(n: float, sec: float) -> float:
        return n / sec if sec > 0 else 0.0

    lines: list[str] = []
    for kind, name, text, value in (
            ("counter", "prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
             m.prompt_tokens_total),
            ("counter", "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
             m.prompt_tokens_cached_total),
            ("counter", "prompt_seconds_total", "Total time spent processing prompts", m.prompt_seconds_total),
            ("counter", "tokens_predicted_total", "Number of generation tokens processed", m.tokens_predicted_total),
            ("counter", "tokens_predicted_seconds_total", "Total time spent generating tokens",
             m.tokens_predicted_seconds_total),
            ("counter", "n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding "
             "and multimodal decoding", n_decode),
            ("counter", "n_tokens_max", "Largest observed sequence length (prompt + generation)", m.n_tokens_max),
            ("counter", "spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
             m.draft_tokens_total),
            ("counter", "spec_decode_num_accepted_tokens_total",
             "Speculative: Total draft tokens accepted by the target model", m.draft_accepted_total),
            ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             rate(m.prompt_tokens_total, m.prompt_seconds_total)),
            ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s",
             rate(m.tokens_predicted_total, m.tokens_predicted_seconds_total)),
            ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             n_seq_decode / max(n_decode, 1))):
        lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    lines += [
        "# HELP llamacpp:requests_processing Number of requests processing",
        "# TYPE llamacpp:requests_processing gauge",
        f"llamacpp:requests_processing {busy}",
        "# HELP llamacpp:requests_deferred Number of requests deferred",
        "# TYPE llamacpp:requests_deferred gauge",
        f"llamacpp:requests_deferred {waiting}",
        "# HELP cooktop:slots_busy Slots running a request.",
        "# TYPE cooktop:slots_busy gauge",
        f"cooktop:slots_busy {busy}",
        "# HELP cooktop:slots_total Slots (-np).",
        "# TYPE cooktop:slots_total gauge",
        f"cooktop:slots_total {n_slots}",
        "# HELP cooktop:batch_size Sequences in the latest forward pass.",
        "# TYPE cooktop:batch_size gauge",
        f"cooktop:batch_size {n_seqs}",
        "# HELP cooktop:batch_tokens Tokens in the latest forward pass (decoding and prompt).",
        "# TYPE cooktop:batch_tokens gauge",
        f"cooktop:batch_tokens {n_tokens}",
        "# HELP cooktop:tokens_per_second Generated tokens per second, all slots (last 10 s with -np > 1).",
        "# TYPE cooktop:tokens_per_second gauge",
        f"cooktop:tokens_per_second {tps:.3f}",
        "# HELP cooktop:requests_total Requests received, by endpoint.",
        "# TYPE cooktop:requests_total counter",
    ]
    for ep in ("chat", "completions", "completion", "embeddings", "responses", "messages", "rerank", "slots"):
        lines.append(f'cooktop:requests_total{{endpoint="{ep}"}} {m.requests_total[ep]}')
    lines += ["# HELP cooktop:errors_total Generations that ended in an error.", "# TYPE cooktop:errors_total counter",
              f"cooktop:errors_total {m.errors_total}"]
    return "\n".join(lines) + "\n"
