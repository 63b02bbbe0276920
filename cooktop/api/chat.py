"""``Llama.create_chat_completion``: a conversation through the chat template, then a completion.

The template is chosen once per ``Llama`` by
:func:`cooktop.text.chat_template.resolve_template` (``chat_template_file``,
``chat_template``, ``chat_format``, the model's ``tokenizer.chat_template``,
else ``chatml`` with a logged notice, as llama.cpp does). The rendered prompt
loses a leading BOS text the tokenizer adds anyway (llama.cpp
``common/chat.cpp``), is tokenized with special tokens parsed, and generation
stops at the template's end-of-turn strings as well as the caller's ``stop``.
Responses are OpenAI's ``chat.completion`` / ``chat.completion.chunk``;
``logprobs``/``top_logprobs`` give OpenAI's chat shape. ``tools`` reach the
template and the answer is parsed into OpenAI ``tool_calls`` in the template's
own syntax, ``<think>`` blocks and gpt-oss's analysis channel into
``reasoning_content`` (:mod:`cooktop.api.chat_plan`, :mod:`cooktop.text.tool_calls`);
``tool_choice`` ``required`` or a named function is enforced with a grammar.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..engine.generate import Generation, Step
from ..errors import ChatTemplateError, CooktopError
from ..text import gemma4_calls
from ..text.chat_messages import check_roles, continued_content
from ..text.chat_template import TemplateChoice, resolve_template, strip_added_specials
from ..text.reasoning import prompt_opens_thinking
from ..text.tool_calls import MessageStream, detect_format
from .base import LlamaBase
from .chat_plan import ChatPlan, ThinkBudget, assemble_message, plan_chat
from .completion import MAX_TOP_LOGPROBS, n_predict_of, stop_list
from .grammar import GrammarError, from_response_format
from .logprobs import log_softmax, top_k
from .types import ChatCompletion, ChatCompletionChunk, CompletionUsage

log = logging.getLogger("cooktop")


def _token_entry(text: str, raw: bytes, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


class ChatMixin(LlamaBase):
    """Chat completion for :class:`cooktop.api.llama.Llama`."""

    chat_template_override: str | None = None
    chat_template_file: str | None = None

    def chat_template_choice(self) -> TemplateChoice:
        """The chat template this model renders with (resolved on first use; a fallback is logged once).

        Raises:
            ChatTemplateError: an unknown ``chat_format``, or a template that does not compile.
        """
        if self._chat is None:
            md = self._gf.metadata
            tk = self._tokenizer
            bos = tk.token_to_piece(tk.bos_id, special=True).decode("utf-8", "replace") if tk.bos_id >= 0 else ""
            eos = tk.token_to_piece(tk.eos_id, special=True).decode("utf-8", "replace") if tk.eos_id >= 0 else ""
            tool_use = md.get("tokenizer.chat_template.tool_use")
            choice = resolve_template(md.get("tokenizer.chat_template") or None, chat_format=self.chat_format,
                                      chat_template=self.chat_template_override,
                                      chat_template_file=self.chat_template_file,
                                      tool_use_template=tool_use if isinstance(tool_use, str) else None,
                                      bos_token=bos, eos_token=eos)
            if choice.notice:
                log.warning("%s", choice.notice)
            self._chat = choice
        return self._chat

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True, continue_final_message: bool = False,
                            **kwargs: Any) -> str:
        """The prompt text a conversation renders to (llama-server's ``/apply-template``);
        ``continue_final_message``: see :meth:`create_chat_completion`. With a chat handler, image
        parts render as ``<__media__>`` (not decoded here).

        Raises:
            ChatTemplateError: the template refused the conversation or failed on it, or
                ``continue_final_message`` without an assistant message last.
        """
        tmpl = self.chat_template_choice().for_request(tools)
        if self.chat_handler is not None:  # image parts shown as their media markers
            from ..text.chat_messages import images_to_markers
            from .multimodal import IMAGE_TYPES

            messages = images_to_markers(messages, IMAGE_TYPES)[0]
        messages = check_roles(messages)
        if continue_final_message:
            last = self._continued(messages)
            return tmpl.render(messages[:-1], add_generation_prompt=True, tools=tools or None,
                               **kwargs) + continued_content(last)
        return tmpl.render(messages, add_generation_prompt=add_generation_prompt, tools=tools or None, **kwargs)

    @staticmethod
    def _continued(messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The final assistant message ``continue_final_message`` continues.

        Raises:
            ChatTemplateError: the last message is not the assistant's, or it calls tools.
        """
        if not messages or messages[-1].get("role") != "assistant":
            raise ChatTemplateError("continue_final_message needs the assistant's message last")
        if messages[-1].get("tool_calls"):
            raise ChatTemplateError("Cannot continue an assistant message that contains tool calls.")
        return messages[-1]

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    **kwargs: Any) -> tuple[list[int], list[str]]:
        """(prompt token ids, the template's stop strings) for a conversation.

        Raises:
            ChatTemplateError: see :meth:`apply_chat_template`.
        """
        text, tokens, stops = self._chat_render(messages, tools, **kwargs)
        return tokens, stops

    def _chat_render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     continue_final_message: bool = False, add_generation_prompt: bool = True,
                     **kwargs: Any) -> tuple[str, list[int], list[str]]:
        """(prompt text, its token ids, the template's stop strings); see :meth:`chat_prompt`.
        ``continue_final_message``: the conversation but its last (assistant) message, the generation
        prompt, then that message's text left open (llama.cpp common/chat.cpp: ``messages[:-1]``
        rendered, ``generation_prompt + render_content()`` appended)."""
        tmpl = self.chat_template_choice().for_request(tools)
        tail = ""
        if continue_final_message:
            tail = continued_content(self._continued(messages))
            messages, add_generation_prompt = messages[:-1], True
        text = tmpl.render(messages, add_generation_prompt=add_generation_prompt, tools=tools or None, **kwargs)
        if add_generation_prompt and text.endswith("<turn|>\n") and detect_format(tmpl.source) == "gemma4":
            text += "<|turn>model\n"  # llama.cpp common_chat_params_init_gemma4: a turn left closed is reopened
        text += tail
        text = strip_added_specials(text, tmpl.bos_token, tmpl.eos_token, add_bos=self._tokenizer.vocab.add_bos)
        return text, self.tokenize(text, add_bos=True, special=True), list(tmpl.stop)

    def _image_messages(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
        """``messages`` with their image parts as media markers, and the images decoded in order
        (:mod:`cooktop.api.multimodal`; only with a chat handler).

        Returns:
            (the messages, uint8 [h, w, 3] per image part).
        Raises:
            ImageError: an image part without a URL, an http(s) URL, a malformed data URI, an
                unreadable or undecodable image.
        """
        from ..text.chat_messages import images_to_markers
        from .multimodal import IMAGE_TYPES, image_url_of, load_image

        marked, parts = images_to_markers(messages, IMAGE_TYPES)
        return marked, [load_image(image_url_of(p, i)) for i, p in parts]

    def _prefill_images(self, images: list[np.ndarray], text: str) -> Any:
        """Encode ``images`` with the chat handler's mmproj and evaluate the rendered prompt ``text``
        (one ``<__media__>`` per image) but its last text chunk on the engine's default sequence
        (:func:`cooktop.vision.session.prefill`).

        Returns:
            the :class:`~cooktop.vision.session.Prefilled` (its ``tokens``: the prompt's ids for
            ``Engine.generate``, negative placeholder ids at the image positions).
        Raises:
            ImageError: the prompt's marker count differs from the images (a literal ``<__media__>``
                in a text part). ContextOverflowError: the prompt with its images does not fit.
            CooktopError: a context shift (``context_shift=True``) or a per-thread sequence (the
                server's slots, :meth:`create_completions`): not supported with images.
        """
        from ..vision.session import prefill

        if self._n_keep is not None:
            raise CooktopError("images with context_shift=True are not supported: the image positions cannot "
                               "be evaluated again as tokens; load the Llama without context_shift")
        if self._active_seq is not None:
            raise CooktopError("images are supported on the Llama's own sequence only (not in the server's "
                               "slots or batched completions)")
        handler = self.chat_handler
        pre = prefill(self._engine, handler.mmproj, images, text, use_gpu=handler.use_gpu)
        for line in pre.lines():
            log.info("%s", line)
        return pre

    def create_chat_completion(self, messages: list[dict[str, Any]], functions: Any = None,
                               function_call: Any = None, tools: list[dict[str, Any]] | None = None,
                               tool_choice: Any = None, temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               response_format: dict[str, Any] | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: Any = None, grammar: Any = None,
                               logit_bias: dict | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None, stopping_criteria: Any = None,
                               parallel_tool_calls: bool | None = None, reasoning_format: str | None = None,
                               chat_template_kwargs: dict[str, Any] | None = None,
                               reasoning_budget: int | None = None, post_sampling_probs: bool = False,
                               add_generation_prompt: bool = True, continue_final_message: bool = False,
                               ) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """Answer a conversation (OpenAI ``chat.completion``), llama-cpp-python's arguments.

        Args:
            messages: ``[{"role": ..., "content": ...}, ...]``; ``developer`` is taken as ``system``.
            tools: OpenAI tools, rendered by the template; calls in the answer come back as
                ``message.tool_calls`` (finish_reason ``tool_calls``). ``functions`` are taken as tools.
            tool_choice: ``none`` / ``auto`` / ``required`` / ``{"type": "function", "function":
                {"name": ...}}`` (``function_call`` likewise); required and named are grammar-enforced.
            parallel_tool_calls: allow several calls in one answer (default False, as llama-server).
            reasoning_format: ``none`` (thinking left in content), ``deepseek``/``auto`` (the default:
                moved to ``message.reasoning_content``), ``deepseek-legacy`` (both).
            chat_template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}``.
            reasoning_budget: -1 unlimited, 0 no thinking (``enable_thinking=False``), N > 0 at most N
                thinking tokens (then ``</think>`` is forced).
            response_format: ``{"type": "json_object"}`` (optionally ``"schema"``) or
                ``{"type": "json_schema", "json_schema": {"schema": ...}}``: constrained output.
            logprobs, top_logprobs: OpenAI chat logprobs (``top_logprobs`` 0..20).
            post_sampling_probs: cooktop's, llama-server's field (tools/server/server-task.cpp
                ``probs_vector_to_json``): with ``logprobs``, each entry has ``prob`` (0..1, not a log)
                and ``top_probs`` (at most ``top_logprobs``, probability 0 left out) from the
                distribution after the sampler chain, instead of ``logprob`` / ``top_logprobs``.
            add_generation_prompt: end the prompt with the assistant's header (default; False: the
                conversation as it is, llama-server's field).
            continue_final_message: the last message is the assistant's and the answer continues it (its
                text left open after the generation prompt, no end of turn; llama-server's and vLLM's field,
                the server's assistant prefill); the answer holds only the continuation.
            Others as :meth:`create_completion` (temperature defaults to 0.2 here, as in llama-cpp-python).
        Returns:
            a ``chat.completion`` dict, or an iterator of ``chat.completion.chunk`` s when ``stream``
            (the last carries ``usage`` as an extra key).
            With ``Llama(chat_handler=...)`` (:mod:`cooktop.api.multimodal`) a message's content parts
            may be images: ``{"type": "image_url", "image_url": {"url": URL}}`` (or ``"image_url": URL``),
            URL a ``data:image/...;base64,...`` URI, a local path or a ``file://`` URL. Each becomes
            ``<__media__>`` in the rendered prompt, the images are encoded and the prompt evaluated
            (:func:`cooktop.vision.session.prefill`), then generation goes on as for text (no draft
            model); ``usage.prompt_tokens`` counts the image positions.
        Raises:
            ImageError: (with a chat handler) an http(s) URL (never fetched), a malformed data URI,
            an unreadable or undecodable image.
            ChatTemplateError: an unknown role, a message without its content, an image part without a
            chat handler, or the template refused the conversation. ContextOverflowError: the
            prompt does not fit. GrammarError: grammar and response_format both given, or bad.
            ToolCallError: malformed tools, tool_choice, tool-call messages or reasoning options,
            or a grammar given with tools.
        """
        eng = self._engine
        if mirostat_mode:
            raise CooktopError("mirostat sampling is not implemented in cooktop; use mirostat_mode=0")
        if top_logprobs is not None and (isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int)
                                         or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS):
            raise CooktopError(f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, got {top_logprobs!r}")
        rf = from_response_format(response_format)
        if rf is not None and grammar is not None:
            raise GrammarError("give either grammar or response_format, not both")
        if tools is None and functions:
            tools = [{"type": "function", "function": f} for f in functions]
        if tool_choice is None and function_call is not None:
            tool_choice = ({"type": "function", "function": function_call} if isinstance(function_call, dict)
                           else function_call)
        images: list[np.ndarray] = []
        if self.chat_handler is not None:
            messages, images = self._image_messages(messages)
        messages = check_roles(messages)
        plan = plan_chat(self, messages, tools=tools, tool_choice=tool_choice,
                         grammar=rf if rf is not None else grammar, parallel_tool_calls=parallel_tool_calls,
                         reasoning_format=reasoning_format, chat_template_kwargs=chat_template_kwargs,
                         reasoning_budget=reasoning_budget)
        text, tokens, template_stops = self._chat_render(plan.messages, plan.tools, bool(continue_final_message),
                                                         bool(add_generation_prompt), **plan.template_kwargs)
        draft, pre = self._speculation(), None
        if images:  # the prompt's ids become the images' prefill: their placeholder ids at the image positions
            pre = self._prefill_images(images, text)
            tokens, draft = pre.tokens, None
        opened = prompt_opens_thinking(text)
        procs = list(logits_processor) if logits_processor is not None else []
        if plan.budget > 0:
            tags = (gemma4_calls.CHANNEL_OPEN + gemma4_calls.THOUGHT, gemma4_calls.CHANNEL_CLOSE,
                    gemma4_calls.CHANNEL_CLOSE) if plan.fmt == "gemma4" else None
            procs.append(ThinkBudget(self, len(tokens), plan.budget, opened, tags))
        sampler = self._sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                typical_p=typical_p, repeat_penalty=repeat_penalty,
                                presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                logit_bias=logit_bias, seed=seed, logits_processor=procs or None,
                                grammar=plan.grammar)
        stops = stop_list(stop) + [s for s in template_stops if s not in stop_list(stop)]
        criteria = list(stopping_criteria) if stopping_criteria is not None else []
        steps = eng.generate(tokens, n_predict_of(max_tokens), sampler, stops, stopping_criteria=criteria,
                             seq=self._active_seq, preserved=plan.preserved, draft=draft,
                             n_keep=self._n_keep)
        if pre is not None:  # evaluated in this call on the emptied sequence: read, not cached
            steps.count_prompt_scoring(len(tokens), pre.encode_ms + pre.eval_ms)
        k = (top_logprobs or 0) if logprobs else None
        chat = _Chat(self, steps, len(tokens), model or self.model_path, k, plan, opened)
        chat.post_sampling = bool(post_sampling_probs)
        return chat.chunks() if stream else chat.whole()


class _Chat:
    """Turns the steps of one generation into chat chunks or one ``chat.completion``."""

    def __init__(self, llm: Any, steps: Generation, n_prompt: int, model: str, top: int | None, plan: ChatPlan,
                 thinking_open: bool):
        self.llm, self.steps, self.n_prompt, self.model, self.top = llm, steps, n_prompt, model, top
        self.reader = MessageStream(plan.fmt, reasoning_format=plan.reasoning_format, thinking_open=thinking_open,
                                    tools=plan.parse_tools)
        self.id = f"chatcmpl-{uuid.uuid4()}"
        self.created = int(time.time())
        self.n_generated = 0
        self.post_sampling = False

    def usage(self) -> CompletionUsage:
        """Token counts; ``prompt_tokens_details.cached_tokens``: prompt tokens reused from the cache (OpenAI's)."""
        return {"prompt_tokens": self.n_prompt, "completion_tokens": self.n_generated,
                "total_tokens": self.n_prompt + self.n_generated,
                "prompt_tokens_details": {"cached_tokens": self.steps.n_cached}}

    def _logprob(self, step: Step) -> dict[str, Any] | None:
        if self.top is None or step.token is None or step.logits is None:  # logits: None only on the last step
            return None
        tk = self.llm._tokenizer
        if self.post_sampling and step.candidates is not None:
            ids, probs = step.candidates

            def piece(i: int, p: float) -> dict[str, Any]:
                raw = tk.token_to_piece(i)
                return {"token": raw.decode("utf-8", "replace"), "prob": p, "bytes": list(raw)}

            hit = np.flatnonzero(ids == step.token)
            out = piece(step.token, float(probs[hit[0]]) if len(hit) else 1.0)
            out["top_probs"] = [piece(int(i), float(p)) for i, p in zip(ids[:self.top], probs[:self.top]) if p > 0]
            return out
        lps = log_softmax(step.logits)

        def entry(i: int, lp: float) -> dict[str, Any]:
            raw = tk.token_to_piece(i)
            return _token_entry(raw.decode("utf-8", "replace"), raw, lp)

        e = entry(step.token, float(lps[step.token]))
        e["top_logprobs"] = [entry(i, lp) for i, lp in top_k(lps, self.top)]
        return e

    def _chunk(self, delta: dict[str, Any], finish: str | None, lp: list | None) -> ChatCompletionChunk:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta,
                             "logprobs": None if lp is None else {"content": lp, "refusal": None},
                             "finish_reason": finish}]}

    def chunks(self) -> Iterator[ChatCompletionChunk]:
        """Role first, then content / reasoning / tool-call deltas, then an empty delta with
        ``finish_reason`` (``tool_calls`` when the answer called tools and was not cut off) and ``usage``
        (plus ``stopping_word``, the stop string that ended it, when one did)."""
        try:
            yield self._chunk({"role": "assistant", "content": ""}, None, None)
            for step in self.steps:
                if step.token is not None:
                    self.n_generated += 1
                e = self._logprob(step)
                final = step.finish_reason is not None
                deltas = self.reader.feed(step.text, final=final) if (step.text or final) else []
                for i, d in enumerate(deltas):
                    yield self._chunk(d, None, None if e is None or i else [e])
                if e is not None and not deltas:
                    yield self._chunk({}, None, [e])
                if final:
                    finish = step.finish_reason
                    if self.reader.calls and finish != "length":
                        finish = "tool_calls"
                    last = self._chunk({}, finish, None)
                    last["usage"] = self.usage()
                    if step.stop_word is not None:  # llama-server's name for the stop string that matched
                        last["stopping_word"] = step.stop_word
                    yield last
        finally:
            self.steps.close()
            if self.steps.result is not None:
                self.llm._last = self.steps.result

    def whole(self) -> ChatCompletion:
        """The non-streamed ``chat.completion``: the stream's deltas joined (:func:`assemble_message`)."""
        deltas, lps = [], []
        finish = "length"
        usage: Any = None
        for c in self.chunks():
            ch = c["choices"][0]
            deltas.append(ch["delta"])
            if ch["logprobs"] is not None:
                lps += ch["logprobs"]["content"]
            if ch["finish_reason"] is not None:
                finish, usage = ch["finish_reason"], c.get("usage")
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": assemble_message(deltas),
                             "logprobs": {"content": lps, "refusal": None} if self.top is not None else None,
                             "finish_reason": finish}],
                "usage": usage or self.usage()}
