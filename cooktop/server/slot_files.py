"""Slot files: what ``POST /slots/ID?action=save`` writes and ``action=restore`` reads.

llama-server writes a slot's K/V cells (``llama_state_seq_save_file``); cooktop writes the
slot's tokens and the identity of the model that made them (JSON: ``format``, ``version``,
``model``: file name, architecture, ``n_vocab``, ``n_embd``, ``n_layer``; ``tokens``), and a
restore evaluates those tokens again in the slot: the same K/V and recurrent states (a
batch, token by token and a reused prefix give the same values), at the cost of one prompt
evaluation. A file of another model, another format or a damaged one is refused by name.
The file name is checked as llama-server's ``fs_validate_filename`` would (no folder parts,
no ``..``, no control characters).
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import protocol as P

FORMAT = "cooktop-slot"
VERSION = 1


def check_filename(body: Any) -> str:
    """``filename`` of a save / restore body, a plain file name.

    Raises:
        HTTPError: 400 ``Invalid filename`` (llama-server's message) for a missing name, a path,
            ``.`` / ``..``, a name over 255 bytes or with control characters.
    """
    name = body.get("filename") if isinstance(body, dict) else None
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or len(name.encode("utf-8", "surrogatepass")) > 255 or any(ord(c) < 32 or ord(c) == 127 for c in name)
            or name.startswith(" ") or name.endswith((" ", "."))):
        raise P.HTTPError(400, "Invalid filename", "invalid_request_error", "filename")
    return name


def model_identity(llm: Any, model_path: str) -> dict[str, Any]:
    """What a slot file records of the model: the tokens mean the same only for the same one."""
    cfg = llm._engine.cfg
    return {"file": os.path.basename(model_path), "architecture": cfg.arch, "n_vocab": llm.n_vocab(),
            "n_embd": llm.n_embd(), "n_layer": cfg.n_layer}


def write(path: str, identity: dict[str, Any], tokens: list[int]) -> int:
    """Write a slot file; returns its size in bytes (``n_written``).

    Raises:
        HTTPError: 500 when the file cannot be written (the OS's reason).
    """
    data = json.dumps({"format": FORMAT, "version": VERSION, "model": identity, "tokens": tokens}).encode()
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise P.HTTPError(500, f"cannot write the slot file {os.path.basename(path)}: {e.strerror}",
                          "server_error") from None
    return len(data)


def read(path: str, identity: dict[str, Any], n_ctx: int) -> tuple[list[int], int]:
    """(tokens, bytes read) of a slot file written for this model.

    Raises:
        HTTPError: 400 for a missing file, one that is not a cooktop slot file, one saved from
            another model (naming both), tokens outside the vocabulary or more than ``n_ctx``.
    """
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise P.HTTPError(400, f"no slot file {name} in --slot-save-path") from None
    except OSError as e:
        raise P.HTTPError(400, f"cannot read the slot file {name}: {e.strerror}") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: nested too deeply
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise P.HTTPError(400, f"{name} is not a cooktop slot file (llama-server's binary slot files cannot be "
                               "read: save the slot with cooktop)")
    if doc.get("version") != VERSION:
        raise P.HTTPError(400, f"{name}: slot file version {doc.get('version')!r}, this cooktop reads {VERSION}")
    if doc.get("model") != identity:
        raise P.HTTPError(400, f"{name} was saved from another model ({doc.get('model')}); this server runs "
                               f"{identity}")
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                               and 0 <= t < identity["n_vocab"] for t in tokens):
        raise P.HTTPError(400, f"{name}: invalid tokens in the slot file")
    if len(tokens) > n_ctx:
        raise P.HTTPError(400, f"{name}: its {len(tokens)} tokens do not fit in the slot's context ({n_ctx})")
    return tokens, len(raw)
