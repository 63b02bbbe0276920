"""Response shapes of the Python API: llama-cpp-python's ``llama_types`` (OpenAI's schemas).

Plain dicts at run time; these ``TypedDict`` s document the keys.
"""

from __future__ import annotations

from typing import Any, TypedDict


class CompletionLogprobs(TypedDict):
    """OpenAI legacy completions ``logprobs``: one entry per generated token."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionUsage(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]  # {"cached_tokens": prompt tokens reused from the KV cache}


class Completion(TypedDict, total=False):
    """``text_completion`` (also each streamed chunk, with ``finish_reason`` None until the last)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


class ChatCompletionTokenLogprob(TypedDict):
    """OpenAI chat ``logprobs.content[i]``."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[dict[str, Any]]


class ChatCompletionMessage(TypedDict, total=False):
    role: str
    content: str | None
    reasoning_content: str
    tool_calls: list[dict[str, Any]]


class ChatCompletionChoice(TypedDict):
    index: int
    message: ChatCompletionMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletion(TypedDict, total=False):
    """``chat.completion``."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage


class ChatCompletionChunk(TypedDict, total=False):
    """``chat.completion.chunk``: ``choices[i].delta`` holds the new role/content; the last has ``usage``."""

    id: str
    object: str
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: CompletionUsage


class Embedding(TypedDict):
    object: str
    embedding: list[float] | list[list[float]]
    index: int


class CreateEmbeddingResponse(TypedDict):
    """``list`` of ``embedding`` objects, with ``usage`` (prompt and total tokens)."""

    object: str
    data: list[Embedding]
    model: str
    usage: dict[str, int]
