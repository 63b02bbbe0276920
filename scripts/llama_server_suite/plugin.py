"""pytest plugin for llama.cpp's server suite run offline (scripts/llama_server_suite/run.sh): the
suite's session fixture downloads every preset's model first (``ServerPreset.load_all``), which fails
on a machine without the network; here it does nothing, so the cases of the models in the prepared
cache run and those of the others fail at their server's start."""

from __future__ import annotations

import sys


def pytest_sessionstart(session) -> None:
    """Turn the suite's model download off (its conftest has imported ``utils`` by now)."""
    utils = sys.modules.get("utils")
    if utils is None:
        raise RuntimeError("llama-server-suite: the suite's utils module is not loaded; is this tools/server/tests?")
    utils.ServerPreset.load_all = staticmethod(lambda: None)
