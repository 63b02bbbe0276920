"""report.json's JSON Schema (draft 2020-12) and its check (the ``jsonschema`` library, ``report`` extra).

Every figure row carries the ``command`` that measures it alone (``cooktop bench``, ``bench --ops``,
``kld-table``, ``plan``), so a cell of the page can be reproduced with one command.
"""

from __future__ import annotations

from typing import Any

from ..errors import CooktopError

_NUM = {"type": ["number", "null"]}
_STR = {"type": "string"}
_CMD = {"type": "string", "minLength": 1}


def _rows(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "object", "required": sorted(props), "properties": props}}


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "cooktop report",
    "type": "object",
    "required": ["schema", "suite", "cooktop_version", "created", "command", "machine", "environment", "steps",
                 "devices", "models", "ops", "bench", "kld", "plans", "recommendations", "seconds"],
    "properties": {
        "schema": {"const": 1},
        "suite": {"type": "object", "required": ["version", "level", "shape", "weight_types", "n_prompt", "n_gen",
                                                 "n_depth", "reps", "n_batch", "kld_ctx", "kld_chunks", "seed"],
                  "properties": {"version": {"type": "integer"}, "level": {"enum": ["quick", "full"]}}},
        "cooktop_version": _STR,
        "created": _STR,
        "command": _CMD,
        "seconds": {"type": "number"},
        "machine": {"type": "object", "required": ["cpu", "cores_logical", "memory_bytes", "os", "python", "packages",
                                                   "devices"]},
        "environment": {"type": "object", "additionalProperties": _STR},
        "nodes": _rows({"node": _STR, "node_id": _STR, "address": _STR, "machine": {"type": "object"},
                        "environment": {"type": "object"}, "seconds": {"type": "number"}}),
        "steps": _rows({"step": _STR, "device": _STR, "command": _STR, "ok": {"type": "boolean"}, "error": _STR,
                        "seconds": {"type": "number"}}),
        "devices": _rows({"family": _STR, "selector": _STR, "usable": {"type": "boolean"}, "name": _STR,
                          "reason": _STR, "measured": {"type": "boolean"}}),
        "models": _rows({"path": _STR, "name": _STR, "desc": _STR, "weight_type": _STR,
                         "size_bytes": {"type": "integer"}, "n_params": {"type": "integer"}, "error": _STR}),
        "ops": _rows({"device": _STR, "op": _STR, "ggml_type": _STR, "shape": _STR, "n_tokens": {"type": "integer"},
                      "seconds": _NUM, "gbps": _NUM, "gflops": _NUM, "roofline_pct": _NUM, "peak_gbps": _NUM,
                      "peak_source": _STR, "note": _STR, "command": _CMD}),
        "bench": _rows({"device": _STR, "backend": _STR, "model": _STR, "weight_type": _STR, "test": _STR,
                        "n_prompt": {"type": "integer"}, "n_gen": {"type": "integer"},
                        "n_depth": {"type": "integer"}, "avg_ts": _NUM, "stddev_ts": _NUM,
                        "samples_ts": {"type": "array", "items": {"type": "number"}}, "placement": _STR,
                        "error": _STR, "command": _CMD}),
        "kld": _rows({"device": _STR, "model": _STR, "weight_type": _STR,
                      "summary": {"type": ["object", "null"], "required": ["kld", "kld_unc", "same_top", "ppl"],
                                  "additionalProperties": {"type": "number"}},
                      "placement": _STR, "note": _STR, "error": _STR, "command": _CMD}),
        "plans": _rows({"device": _STR, "model": _STR, "n_gpu_layers": {"type": ["integer", "string"]},
                        "n_offloaded": {"type": "integer"}, "n_layer": {"type": "integer"}, "summary": _STR,
                        "fits": {"type": "boolean"}, "command": _CMD}),
        "recommendations": _rows({"model": _STR, "device": {"type": ["string", "null"]},
                                  "backend": {"type": ["string", "null"]},
                                  "n_gpu_layers": {"type": ["integer", "string", "null"]}, "reason": _STR}),
    },
}


def validate(doc: Any) -> None:
    """Check a report against :data:`SCHEMA`.

    Raises:
        CooktopError: ``jsonschema`` is not installed (``pip install 'cooktop[report]'``), or the
            document does not match (naming the first wrong place and why).
    """
    try:
        import jsonschema
    except ImportError:
        raise CooktopError("checking report.json needs jsonschema: pip install 'cooktop[report]'") from None
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc))
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "(top)"
        raise CooktopError(f"report.json does not match its schema at {where}: {err.message}")
