"""``POST /v1/rerank`` (and ``/rerank``, ``/v1/reranking``, ``/reranking``): llama-server's reranking endpoint.

Body: ``query`` (string), ``documents`` (strings, or ``{"text": ...}`` objects),
optional ``top_n`` and ``return_documents``. Answer (llama-server's, the
Jina / Cohere shape): ``results`` sorted by ``relevance_score``, best first,
each with the document's ``index`` (and ``document.text`` when asked), plus
``usage``. Scores come from the model's rank pooling and classification head
(:mod:`cooktop.api.rerank`); a model without them gets 501
``not_supported_error``, as llama-server answers when it is not a reranker.
Bad input: 400, OpenAI-shaped.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..api.rerank import RerankUnsupportedError, rerank
from . import protocol as P
from .bridge import Bridge


def rerank_request(body: dict[str, Any]) -> tuple[str, list[str], int | None, bool]:
    """(query, documents, top_n, return_documents) of a rerank body.

    Raises:
        HTTPError: 400 for a missing or malformed field.
    """
    query = body.get("query")
    if not isinstance(query, str):
        raise P.bad("query", "expected a string")
    docs = body.get("documents", body.get("texts"))
    if not isinstance(docs, list) or not docs:
        raise P.bad("documents", "expected a non-empty list of strings")
    texts = []
    for i, d in enumerate(docs):
        if isinstance(d, dict) and isinstance(d.get("text"), str):
            d = d["text"]
        if not isinstance(d, str):
            raise P.bad(f"documents[{i}]", "expected a string or {'text': ...}")
        texts.append(d)
    top_n = P.field(body, "top_n", int, None, minimum=1)
    return query, texts, top_n, P.field(body, "return_documents", bool, False)


def register(app: FastAPI, bridge: Bridge) -> None:
    """Add the rerank endpoints to ``app``."""

    @app.post("/v1/rerank")
    @app.post("/rerank")
    @app.post("/v1/reranking")
    @app.post("/reranking")
    async def rerank_endpoint(request: Request):
        try:
            body = await bridge.body_of(request)
            model = bridge.model_name(body)
            query, docs, top_n, with_docs = rerank_request(body)
            bridge.state.ready.metrics.requests_total["rerank"] += 1
            scores, n_tokens = await bridge.run(lambda llm: rerank(llm, query, docs))
        except RerankUnsupportedError as e:
            return JSONResponse(P.error_body(501, f"{e}; start cooktop serve with a reranker model (--rerank)",
                                             "not_supported_error"), status_code=501)
        except Exception as e:  # noqa: BLE001 - an OpenAI-shaped error
            return bridge.openai_error(e)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n]
        results = [{"index": i, "relevance_score": scores[i], **({"document": {"text": docs[i]}} if with_docs else {})}
                   for i in order]
        bridge.state.ready.metrics.prompt_tokens_total += n_tokens
        return {"model": model, "object": "list", "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                "results": results}
