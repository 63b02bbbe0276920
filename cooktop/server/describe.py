"""What the server says about its model: the bodies of ``GET /props`` and ``GET /v1/models``.

Both are built from the loaded model while the server is awake and kept (``ServerState.cached``) when it
goes to sleep (:mod:`.sleep`), so that they answer without the model then, as llama-server's cached
responses do (tools/server/server-context.cpp ``get_res_props``, ``get_res_models``,
``update_cached_responses``).
"""

from __future__ import annotations

import os
from typing import Any

from ..version import __version__
from . import protocol as P


def models_body(config: Any, llm: Any, started: float) -> dict[str, Any]:
    """``GET /v1/models``: the one served model (OpenAI's list shape with llama-server's ``meta``:
    ``n_vocab``, ``n_ctx``, ``n_embd``, ``n_ctx_train``, ``size`` in bytes of the file).

    ``config``: the ``ServerConfig``; ``llm``: the loaded ``Llama``; ``started``: the server's start
    (Unix seconds, the model's ``created``)."""
    return {"object": "list", "data": [{
        "id": config.model_id, "aliases": config.aliases,
        "tags": sorted({t.strip() for t in (config.tags or "").split(",") if t.strip()}),
        "object": "model", "created": int(started), "owned_by": "cooktop",
        "meta": {"n_vocab": llm.n_vocab(), "n_ctx": llm.n_ctx(), "n_embd": llm.n_embd(),
                 "n_ctx_train": llm._engine.cfg.n_ctx_train, "size": os.path.getsize(config.model_path)}}]}


def props_body(config: Any, llm: Any, n_slots: int, is_sleeping: bool = False) -> dict[str, Any]:
    """``GET /props`` (llama-server's fields: default generation settings with ``n_ctx`` in tokens,
    ``total_slots``, the chat template and its BOS / EOS text, ``modalities``, ``is_sleeping``, ...).

    ``config``: the ``ServerConfig``; ``llm``: the loaded ``Llama``; ``n_slots``: the scheduler's slots;
    ``is_sleeping``: the value to report (True for the copy kept when the server goes to sleep)."""
    tmpl = llm.chat_template_choice().template
    d = {**P.DEFAULTS, **config.defaults}
    params = {k: d[k] for k in ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                                "presence_penalty", "frequency_penalty", "ignore_eos")}
    seed = config.llama_kwargs.get("seed", -1)  # -1 random: llama.cpp's LLAMA_DEFAULT_SEED, 0xFFFFFFFF
    params.update(n_predict=d["max_tokens"], seed=0xFFFFFFFF if seed is None or seed < 0 else seed)
    return {"default_generation_settings": {"n_ctx": llm.n_ctx(), "params": params},
            "total_slots": n_slots, "model_path": config.model_path,
            "model_alias": config.model_id, "chat_template": tmpl.source, "bos_token": tmpl.bos_token,
            "eos_token": tmpl.eos_token, "modalities": {"vision": False, "audio": False},
            "build_info": f"cooktop {__version__}", "webui": config.webui,
            "reasoning_format": config.reasoning_format, "n_vocab": llm.n_vocab(),
            "n_ctx_train": llm._engine.cfg.n_ctx_train, "size": os.path.getsize(config.model_path),
            "is_sleeping": is_sleeping}
