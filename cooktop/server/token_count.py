"""llama-server's token counts of a request before running it: ``POST /chat/completions/input_tokens`` and
``POST /responses/input_tokens`` (and their ``/v1`` spellings; tools/server/server-context.cpp
``handle_count_tokens``): the prompt the body renders to, through the same chat template, tools and
assistant prefill as the completion would, counted, ``{"input_tokens": N}``. Anthropic's
``/v1/messages/count_tokens`` is in :mod:`.anthropic`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from . import protocol as P
from .bridge import Bridge
from .responses import prompt_options
from .responses_api import chat_body


def input_tokens(llm: Any, body: dict[str, Any], config: Any) -> int:
    """The prompt tokens of a chat body (BOS included, as the completion counts them).

    Raises:
        HTTPError / ChatTemplateError / ToolCallError: the body is not a valid chat request.
    """
    args = P.chat_args(body, config)
    tokens, _stops = llm.chat_prompt(args["messages"], args.get("tools"), **prompt_options(args))
    return len(tokens)


def register(app: FastAPI, bridge: Bridge) -> None:
    """Add the ``input_tokens`` routes to ``app``."""

    async def count(request: Request, responses: bool) -> Any:
        try:
            body = await bridge.body_of(request)
            if responses:
                body = chat_body(body)
            return {"input_tokens": input_tokens(bridge.state.ready.llm, body, bridge.config)}
        except Exception as e:  # noqa: BLE001 - an OpenAI-shaped error
            return bridge.openai_error(e)

    @app.post("/chat/completions/input_tokens")
    @app.post("/v1/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request):
        return await count(request, False)

    @app.post("/responses/input_tokens")
    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens(request: Request):
        return await count(request, True)
