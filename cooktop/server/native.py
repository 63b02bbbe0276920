"""llama-server's native endpoints: ``POST /completion`` (and ``/completions``), ``POST /infill``,
``POST /embedding`` (and ``/embeddings``); native there too: OpenAI's are ``/v1/completions`` and
``/v1/embeddings``.

The request and response fields are llama-server's (tools/server/README.md "POST /completion";
tools/server/server-task.cpp ``server_task_result_cmpl_final::to_json_non_oaicompat`` and
``server_task_result_cmpl_partial::to_json_non_oaicompat``), not OpenAI's:

- ``prompt``: a string, token ids, a mixed list of strings and ids (the strings tokenized and
  joined; BOS only where the list starts with a string: server-common.cpp ``tokenize_mixed``),
  or a list of such prompts (one result each, in order: a JSON array when not streamed);
  ``n_cmpl`` (alias ``n``) completions of each (:func:`n_cmpl`, :func:`native_job`).
- ``n_predict`` (-1: until the end of generation or the context), the sampler fields of
  ``/v1/completions`` (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``, the
  penalties, ``seed``, ``logit_bias`` as an object or ``[[id, bias], ...]``, ``ignore_eos``,
  ``stop``, ``grammar`` / ``json_schema``), ``cache_prompt``, ``id_slot``, ``lora`` (``[{"id", "scale"}]``:
  this request's LoRA scales, :mod:`.lora_api`), ``stream``,
  ``return_tokens``, ``n_probs`` (the top alternatives of each token from the raw logits, with
  ``logprob`` and ``top_logprobs``; with ``post_sampling_probs: true`` those after the sampler
  chain instead, as ``prob`` and ``top_probs``), ``response_fields`` (only those fields, keyed by their ``a/b`` paths).
- The answer: ``content``, ``tokens`` (with ``return_tokens``), ``id_slot``, ``stop``, ``model``,
  ``tokens_predicted``, ``tokens_evaluated``, ``generation_settings``, ``prompt`` (the prompt's
  tokens as text), ``has_new_line``, ``truncated``, ``stop_type`` (``eos``, ``word``, ``limit``),
  ``stopping_word``, ``tokens_cached``, ``timings`` and, with ``n_probs``,
  ``completion_probabilities``. Streamed: Server-Sent Events, one partial result per sampled
  token (``content``, ``tokens`` (its id, with or without ``return_tokens``, as llama-server's partial
  results), ``stop: false``, ``tokens_predicted``, ``tokens_evaluated``),
  then the final result with empty ``content`` and ``tokens``; no ``[DONE]`` line (llama-server
  sends none on its native streams).

``/infill`` is fill-in-the-middle on the model's FIM tokens (a model without them: 501
``not_supported_error``, as llama-server): ``input_prefix``, ``input_suffix`` (strings or mixed
lists, required), ``input_extra`` (``[{"filename", "text"}]`` chunks of other files, in the
repo-level pattern where the vocabulary has ``<|repo_name|>`` / ``<|file_sep|>``) and ``prompt``
(text continuing the prefix), laid out as tools/server/server-common.cpp ``format_prompt_infill``
does (the prefix's last 3/4 of a batch, the suffix's first quarter, the extra chunks in what is
left of the context; ``spm_infill``: suffix first); the answer is ``/completion``'s.

``/embedding``: ``content`` (or ``input``) as ``/completion``'s prompt forms, ``embd_normalize``
(-1 none, 0 max-abs to the int16 range, 1 taxicab, 2 Euclidean (default), p > 2 the p-norm:
common/common.cpp ``common_embd_normalize``); a JSON array of ``{"index", "embedding"}``, the
embedding a list of one pooled vector, or with ``--pooling none`` one vector per token, not
normalised (tools/server/server-task.cpp ``server_task_result_embd::to_json_non_oaicompat``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..api.completion import stop_list
from ..api.logprobs import log_softmax
from ..errors import ContextOverflowError
from . import protocol as P
from .bridge import ClientGone
from .lora_api import lora_entries, request_scales
from .responses import eos_ignored, timings_json

#: Most alternatives per token ``n_probs`` may ask for (llama-server caps nothing; the vocabulary does).
MAX_N_PROBS = 100


def native_prompt(llm: Any, prompt: Any) -> str | list[int]:
    """One prompt of ``/completion`` as cooktop's completion takes it: a string as is, token ids
    as is, a mixed list tokenized piece by piece (BOS before the first piece only when it is a
    string, special tokens parsed: llama.cpp tools/server/server-common.cpp ``tokenize_mixed``), and
    llama-server's JSON prompt ``{"prompt_string": S, "multimodal_data": [...]}`` as ``S``.

    Raises:
        HTTPError: 400 for anything else, and for ``multimodal_data`` (this server takes no images
            or audio: no ``--mmproj``).
    """
    if isinstance(prompt, dict):
        if prompt.get("multimodal_data"):
            raise P.bad("prompt", "multimodal_data: this server's model takes no images or audio (no --mmproj)")
        text = prompt.get("prompt_string")
        if not isinstance(text, str):
            raise P.bad("prompt", "a JSON prompt needs a string prompt_string")
        return text
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(
            isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool)) for p in prompt):
        if all(isinstance(p, int) for p in prompt):
            return list(prompt)
        ids: list[int] = []
        for i, p in enumerate(prompt):
            ids += llm.tokenize(p, add_bos=i == 0, special=True) if isinstance(p, str) else [p]
        return ids
    raise P.bad("prompt", "expected a string, token ids, a list mixing both, or a list of those")


def split_prompts(body: dict[str, Any]) -> list[Any]:
    """The prompts of a ``/completion`` body: one (a string, ids, or a mixed list) or a list of them.

    Raises:
        HTTPError: 400 for a missing or empty prompt.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, (str, dict)):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        nums = any(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
        if nums:  # ids, or strings and ids mixed: one prompt (server-common.cpp json_is_array_of_*)
            return [prompt]
        return list(prompt)
    raise P.bad("prompt", "expected a string, token ids, a list mixing both, or a list of those")


def nested_fields(paths: list[str], obj: dict[str, Any]) -> dict[str, Any]:
    """``response_fields``: each ``a/b`` path of ``obj`` that exists, keyed by the path
    (llama.cpp tools/server/server-common.cpp ``json_get_nested_values``)."""
    out: dict[str, Any] = {}
    for path in paths:
        cur: Any = obj
        for key in path.split("/"):
            if not isinstance(cur, dict) or key not in cur:
                break
            cur = cur[key]
        else:
            out[path] = cur
    return out


def token_probs(llm: Any, token: int, logits: np.ndarray, n_probs: int) -> dict[str, Any]:
    """One ``completion_probabilities`` entry: the token, its log-probability under the raw logits
    (float32 [n_vocab]) and the ``n_probs`` most probable tokens (server-task.cpp
    ``probs_vector_to_json`` without post-sampling probabilities)."""
    lps = log_softmax(logits)
    top = np.argsort(-lps, kind="stable")[:n_probs]

    def entry(t: int) -> dict[str, Any]:
        return {**_piece(llm, t), "logprob": float(lps[t])}

    return {**entry(token), "top_logprobs": [entry(int(t)) for t in top]}


def post_sampling_token_probs(llm: Any, token: int, candidates: tuple[np.ndarray, np.ndarray],
                              n_probs: int) -> dict[str, Any]:
    """One ``completion_probabilities`` entry with ``post_sampling_probs``: probabilities (not
    logs) after the sampler chain, ``candidates`` = (ids int64 [m], probabilities float64 [m], best
    first; :attr:`Step.candidates <cooktop.engine.generate.Step>`): ``prob`` of the token (1.0 if it
    is not among them, llama-server's default) and ``top_probs``, at most ``n_probs`` of the
    candidates, those of probability 0 left out (tools/server/server-context.cpp
    ``populate_token_probs``, server-task.cpp ``probs_vector_to_json``)."""
    ids, probs = candidates
    hit = np.flatnonzero(ids == token)
    prob = float(probs[hit[0]]) if len(hit) else 1.0
    top = [{**_piece(llm, int(t)), "prob": float(p)} for t, p in zip(ids[:n_probs], probs[:n_probs])]
    return {**_piece(llm, token), "prob": prob, "top_probs": [e for e in top if e["prob"] > 0.0]}


def _piece(llm: Any, t: int) -> dict[str, Any]:
    """A token's ``id``, ``token`` (its text, an incomplete UTF-8 tail dropped) and ``bytes``."""
    raw = llm._tokenizer.token_to_piece(int(t), special=True)
    return {"id": int(t), "token": raw.decode("utf-8", errors="ignore"), "bytes": list(raw)}


class NativeOptions:
    """The response options of one ``/completion`` request.

    Raises:
        HTTPError: 400 for a field of the wrong type or range.
    """

    def __init__(self, body: dict[str, Any], model: str) -> None:
        self.model = model
        self.stream = P.field(body, "stream", bool, False)
        self.return_tokens = P.field(body, "return_tokens", bool, False)
        self.n_probs = P.field(body, "n_probs", int, 0, minimum=0, maximum=MAX_N_PROBS)
        self.post_sampling_probs = P.field(body, "post_sampling_probs", bool, False)
        fields = body.get("response_fields")
        if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            raise P.bad("response_fields", "expected a list of field paths such as 'generation_settings/n_predict'")
        self.response_fields: list[str] = fields or []
        #: the request's ``lora`` entries as given (``generation_settings.lora``, as llama-server's
        #: ``task_params::to_json``); checked against the adapters by ``lora_api.request_scales``
        self.lora = [{"id": i, "scale": s} for i, s in lora_entries(body).items()]

    def shape(self, result: dict[str, Any]) -> dict[str, Any]:
        """A final result cut to ``response_fields`` (when given); partial results as they are."""
        if self.response_fields and result.get("stop") is True:
            return nested_fields(self.response_fields, result)
        return result


def generation_settings(args: dict[str, Any], opts: NativeOptions, seed: int) -> dict[str, Any]:
    """The ``generation_settings`` of a result: the sampling parameters used (llama.cpp
    tools/server/server-task.cpp ``task_params::to_json``, the fields cooktop has)."""
    grammar = args.get("grammar")
    return {"n_predict": args["n_predict"], "seed": seed, "temperature": args["temperature"],
            "top_k": args["top_k"], "top_p": args["top_p"], "min_p": args["min_p"], "typical_p": args["typical_p"],
            "repeat_penalty": args["repeat_penalty"], "presence_penalty": args["presence_penalty"],
            "frequency_penalty": args["frequency_penalty"], "mirostat": 0, "stop": stop_list(args.get("stop")),
            "max_tokens": args["n_predict"], "ignore_eos": bool(args.get("ignore_eos")), "stream": opts.stream,
            "n_probs": opts.n_probs, "post_sampling_probs": opts.post_sampling_probs,
            "return_tokens": opts.return_tokens, "lora": opts.lora,
            "grammar": getattr(grammar, "source", "") if grammar is not None else ""}


def n_cmpl(body: dict[str, Any], n_parallel: int) -> int:
    """``n_cmpl`` (or its alias ``n``, read when ``n_cmpl`` is absent): completions of each prompt,
    1..``n_parallel`` (llama-server's hard limit: tools/server/server-schema.cpp).

    Raises:
        HTTPError: 400 naming the field for a non-integer or a value out of that range.
    """
    name = "n_cmpl" if body.get("n_cmpl") is not None or "n" not in body else "n"
    value = P.field(body, name, int, 1, minimum=1)
    if value > n_parallel:
        raise P.bad(name, f"must be <= {n_parallel} (the server's slots, -np), got {value}")
    return value


def child_seed(seed: Any, k: int) -> Any:
    """The seed of a prompt's ``k``-th completion (0: the request's own): llama-server's
    ``server_task::add_child`` adds ``k`` (uint32) unless the seed is the default, random one (-1)."""
    if k == 0 or seed is None or seed < 0 or seed == 0xFFFFFFFF:
        return seed
    return (seed + k) % 2**32


def native_job(prompts: list[Any], args: dict[str, Any], opts: NativeOptions, n: int = 1):
    """A job (``make(llm) -> iterator``) of ``/completion``: for each prompt in turn, ``n`` times
    (``n_cmpl``, :func:`child_seed` for each), its partial results (streamed: one per token) and its
    final result, as llama-server's JSON objects; ``index`` counts the completions in that order
    (prompt 0's ``n``, then prompt 1's: server-queue.cpp ``post_tasks``)."""
    def make(llm: Any):
        def gen():
            for index, (prompt, k) in enumerate((p, k) for p in prompts for k in range(n)):
                kw = eos_ignored(llm, dict(args))
                if k:  # the request's seed, else the server's (-s), as the children's base
                    kw["seed"] = child_seed(kw.get("seed") if kw.get("seed") is not None else llm.seed, k)
                ids = native_prompt(llm, prompt)
                if isinstance(ids, str):
                    ids = llm.tokenize(ids, add_bos=True, special=True)
                if len(ids) >= llm.n_ctx() and llm._n_keep is None:  # llama-server: no room to generate
                    raise ContextOverflowError(f"request ({len(ids)} tokens) exceeds the available context size "
                                               f"({llm.n_ctx()} tokens), try increasing it")
                run = llm.start_completion(ids, model=opts.model, **kw)
                yield from _results(llm, run, index, args, opts)
        return gen()
    return make


def _results(llm: Any, run: Any, index: int, args: dict[str, Any], opts: NativeOptions):
    slot = getattr(run.seq, "seq_id", 0)
    texts: list[str] = []
    tokens: list[int] = []
    probs: list[dict[str, Any]] = []
    finish, word = "length", None
    try:
        for step in run.steps:
            if step.token is not None:
                tokens.append(step.token)
                if opts.n_probs and opts.post_sampling_probs and step.candidates is not None:
                    probs.append(post_sampling_token_probs(llm, step.token, step.candidates, opts.n_probs))
                elif opts.n_probs and step.logits is not None:
                    probs.append(token_probs(llm, step.token, step.logits, opts.n_probs))
            texts.append(step.text)
            if step.finish_reason is not None:
                finish, word = step.finish_reason, step.stop_word
            if opts.stream and (step.token is not None or step.text):
                part: dict[str, Any] = {"index": index, "content": step.text,
                                        "tokens": [step.token] if step.token is not None else [],  # always
                                        "stop": False, "id_slot": slot, "tokens_predicted": len(tokens),
                                        "tokens_evaluated": run.n_prompt}
                if opts.n_probs and step.token is not None and probs:
                    part["completion_probabilities"] = [probs[-1]]
                yield part
    finally:
        run.steps.close()
    res = run.steps.result
    if res is not None:
        llm._last = res
    text = "".join(texts)
    stop_type = "limit" if finish == "length" else ("word" if word is not None else "eos")
    # the context filled before n_predict (server-context.cpp: truncated with STOP_TYPE_LIMIT)
    truncated = finish == "length" and (args["n_predict"] < 0 or len(tokens) < args["n_predict"])
    final: dict[str, Any] = {
        "index": index, "content": "" if opts.stream else text,
        "tokens": [] if opts.stream or not opts.return_tokens else tokens, "id_slot": slot, "stop": True,
        "model": opts.model, "tokens_predicted": len(tokens), "tokens_evaluated": run.n_prompt,
        "generation_settings": generation_settings(args, opts, res.seed if res is not None else -1),
        "prompt": llm.detokenize(run.prompt_tokens, special=True).decode("utf-8", errors="replace"),
        "has_new_line": "\n" in text, "truncated": truncated, "stop_type": stop_type, "stopping_word": word or "",
        "tokens_cached": len(run.seq.tokens) if run.seq is not None else run.n_prompt + len(tokens),
        "timings": timings_json(res.timings, run.steps.n_cached) if res is not None else {}}
    if probs and not opts.stream:
        final["completion_probabilities"] = probs
    yield final  # response_fields are applied by the handler, after the scheduler counted the timings


def _mixed(llm: Any, value: Any, name: str) -> list[int]:
    """``input_prefix`` / ``input_suffix``: a string or a list of strings and ids, tokenized without
    BOS or special tokens (``tokenize_mixed(..., false, false)``).

    Raises:
        HTTPError: 400 naming ``name`` for anything else.
    """
    if isinstance(value, str):
        return llm.tokenize(value, add_bos=False, special=False) if value else []
    if isinstance(value, list) and all(isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool))
                                       for p in value):
        return [t for p in value for t in (llm.tokenize(p, add_bos=False, special=False) if isinstance(p, str)
                                           else [p])]
    raise P.bad(name, "expected a string or a list of strings and token ids")


def infill_tokens(llm: Any, body: dict[str, Any], n_predict: int) -> list[int]:
    """The token ids of an ``/infill`` request (module doc; llama.cpp tools/server/server-common.cpp
    ``format_prompt_infill``), for the server's default ``n_predict``.

    Raises:
        HTTPError: 501 when the model has no FIM prefix, suffix or middle token; 400 for a missing
            or malformed ``input_prefix``, ``input_suffix``, ``input_extra`` or ``prompt``.
    """
    pre, suf, mid = llm.token_prefix(), llm.token_suffix(), llm.token_middle()
    missing = [f"{what} token is missing." for what, t in (("prefix", pre), ("suffix", suf), ("middle", mid)) if t < 0]
    if missing:
        raise P.HTTPError(501, "Infill is not supported by this model: " + " ".join(missing), "not_supported_error")
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise P.bad(name, f'"{name}" is required')
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise P.bad("prompt", '"prompt" must be a string')
    extra = body.get("input_extra", [])
    if not isinstance(extra, list) or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str) and isinstance(c.get("filename", ""), str)
            for c in extra):
        raise P.bad("input_extra", 'expected a list of {"filename": string, "text": string}')
    prefix = _mixed(llm, body["input_prefix"], "input_prefix")
    suffix = _mixed(llm, body["input_suffix"], "input_suffix")
    ids = llm.tokenize(prompt, add_bos=False, special=True) if prompt else []
    special = llm._tokenizer.special_ids
    rep, sep = special.get("fim_rep", -1), special.get("fim_sep", -1)

    def text(s: str) -> list[int]:
        return llm.tokenize(s, add_bos=False, special=False)

    extra_ids: list[int] = [rep, *text("myproject\n")] if rep >= 0 else []
    for c in extra:
        extra_ids += [sep, *text(c.get("filename", "tmp") + "\n")] if sep >= 0 else text("\n\n--- snippet ---\n\n")
        extra_ids += text(c["text"])
    if sep >= 0:
        extra_ids += [sep, *text("filename\n")]
    n_batch, n_ctx = llm._engine.n_batch, llm.n_ctx()
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [pre, *prefix[len(prefix) - n_prefix:], *ids]
    tail = [suf, *suffix[:n_suffix]]
    first, last = (tail, head) if llm.spm_infill else (head, tail)
    bos = [llm.token_bos()] if llm._tokenizer.vocab.add_bos and llm.token_bos() >= 0 else []
    return [*extra_ids[len(extra_ids) - n_extra:], *bos, *first, *last, mid]


def embd_normalize(v: np.ndarray, mode: int) -> np.ndarray:
    """``v`` (float [n_embd]) scaled as llama.cpp's ``common_embd_normalize`` (common/common.cpp):
    ``mode`` -1 none, 0 max |v| to 32760 (the int16 range), 1 sum |v|, 2 Euclidean, p > 2 p-norm;
    a zero vector stays zero."""
    x = np.asarray(v, dtype=np.float64)
    if mode < 0:
        return np.asarray(v, dtype=np.float32)
    if mode == 0:
        total = float(np.abs(x).max(initial=0.0)) / 32760.0
    elif mode == 1:
        total = float(np.abs(x).sum())
    elif mode == 2:
        total = float(np.sqrt((x * x).sum()))
    else:
        total = float((np.abs(x) ** mode).sum() ** (1.0 / mode))
    norm = np.float32(1.0 / total) if total > 0.0 else np.float32(0.0)
    return np.asarray(v, dtype=np.float32) * norm


def native_embeddings(llm: Any, prompts: list[Any], mode: int) -> list[dict[str, Any]]:
    """The ``/embedding`` results of ``prompts`` (module doc): run on the scheduler's worker.

    Raises:
        HTTPError: 400 for an empty input; ContextOverflowError: an input longer than the context.
    """
    pooled = llm.pooling() != "none"
    out = []
    for i, prompt in enumerate(prompts):
        p = native_prompt(llm, prompt)
        ids = llm.tokenize(p, add_bos=True, special=True) if isinstance(p, str) else p
        if not ids:
            raise P.HTTPError(400, "Input content cannot be empty")
        raw = llm.embed(ids, normalize=False, truncate=False)
        vectors = [embd_normalize(np.asarray(raw), mode).tolist()] if pooled else raw
        out.append({"index": i, "embedding": vectors, "tokens_evaluated": len(ids)})
    return out


def register(app: Any, ctx: Any) -> None:
    """Add ``POST /completion``, ``/infill``, ``/embedding`` and ``/embeddings`` to ``app`` (``ctx``:
    the app's :class:`~cooktop.server.bridge.Bridge`)."""

    @app.post("/embedding")
    @app.post("/embeddings")
    async def embedding(request: Request):
        try:
            body = await ctx.body_of(request)
            if "input" in body:
                prompt = body["input"]
            elif "content" in body:
                prompt = body["content"]
            else:
                raise P.bad("content", '"input" or "content" must be provided')
            if isinstance(prompt, list) and not prompt:
                raise P.bad("content", '"input" must not be empty')
            prompts = split_prompts({"prompt": prompt})
            mode = P.field(body, "embd_normalize", int, 2, minimum=-1)
            results = await ctx.run(lambda llm: native_embeddings(llm, prompts, mode))
        except Exception as e:  # noqa: BLE001 - the error shape llama-server answers
            return ctx.openai_error(e)
        ctx.state.ready.metrics.requests_total["embeddings"] += 1
        ctx.state.ready.metrics.prompt_tokens_total += sum(r.pop("tokens_evaluated") for r in results)
        return JSONResponse(results)

    @app.post("/completion")
    @app.post("/completions")  # llama-server's native handler too (OpenAI's is /v1/completions)
    async def completion(request: Request):
        return await _serve(ctx, request, infill=False)

    @app.post("/infill")
    async def infill(request: Request):
        return await _serve(ctx, request, infill=True)


async def _serve(ctx: Any, request: Request, infill: bool):
    """One ``/completion`` or ``/infill`` request (module doc): a JSON answer, a stream, or an error."""
    try:
        body = await ctx.body_of(request)
        opts = NativeOptions(body, ctx.model_name(body))
        if infill:
            n_predict = {**P.DEFAULTS, **ctx.config.defaults}["max_tokens"]
            prompts: list[Any] = [infill_tokens(ctx.state.ready.llm, body, n_predict)]
        else:
            prompts = split_prompts(body)
        args = P.sampling_args(body, ctx.config.defaults)
        llm = ctx.state.ready.llm
        args["logit_bias"] = P.vocab_logit_bias(args.get("logit_bias"), llm.n_vocab(),
                                                lambda text: llm.tokenize(text, add_bos=False, special=False))
        # llama-server's count: 0 generates nothing (the prompt is still read), -1 until the context is full
        args["n_predict"] = max(args.pop("max_tokens"), -1)
        args["grammar"] = P.grammar_arg(body, ctx.config.defaults)
        n = n_cmpl(body, ctx.config.n_parallel)
        chunks = await ctx.job(native_job(prompts, args, opts, n), "completion",
                               P.field(body, "cache_prompt", bool, True), P.id_slot(body),
                               request_scales(body, ctx.state.ready.llm))
    except Exception as e:  # noqa: BLE001 - mapped to the error shape llama-server answers
        return ctx.openai_error(e)
    if opts.stream:
        return StreamingResponse(_events(chunks, opts), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        results = [opts.shape(c) for c in await ctx.collect(request, chunks)]
    except ClientGone:  # nobody reads it (nginx's 499); the job was cancelled
        return Response(status_code=499)
    except Exception as e:  # noqa: BLE001
        return ctx.openai_error(e)
    return JSONResponse(results[0] if len(prompts) * n == 1 else results)


async def _events(chunks: AsyncIterator[dict[str, Any]], opts: NativeOptions) -> AsyncIterator[str]:
    """The stream's events; an error after the first chunk is sent as one ``error`` event."""
    try:
        async for c in chunks:
            yield f"data: {json.dumps(opts.shape(c), ensure_ascii=False)}\n\n"
    except Exception as e:  # noqa: BLE001 - the status line is already sent: the error goes in the stream
        status, kind = P.classify(e)
        yield f"data: {json.dumps({'error': P.error_body(status, str(e), kind)['error']}, ensure_ascii=False)}\n\n"
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
