"""GGUF strings are bytes; a display string that is not valid UTF-8 never refuses a file.

llama.cpp keeps GGUF strings as ``std::string`` and loads a model whose ``general.name``
holds a Latin-1 byte; so does cooktop, showing the name with U+FFFD for the bad byte.
Keys (ASCII by the spec) that are not UTF-8 stay a corrupt file.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
from conftest import ROOT, rewrite_gguf
from gguf import GGUFValueType

from cooktop.errors import GGUFError
from cooktop.format.gguf import open_gguf

LATIN1_NAME = "Café model".encode("latin-1")  # b"Caf\xe9 model": not UTF-8


@pytest.fixture(scope="module")
def latin1_model(stories, tmp_path_factory):
    """stories260K with a Latin-1 ``general.name`` and an array of strings with invalid UTF-8."""
    dst = tmp_path_factory.mktemp("latin1") / "latin1.gguf"
    return rewrite_gguf(stories, dst, drop=("general.name",), extra_kv=[
        ("general.name", LATIN1_NAME, GGUFValueType.STRING),
        ("cooktop.test.strings", [b"ok", b"\xff\xfe bytes", "é".encode()], GGUFValueType.ARRAY),
    ])


def test_metadata_decodes_leniently(latin1_model):
    g = open_gguf(latin1_model)
    assert g.metadata["general.name"] == "Caf\ufffd model"
    assert g.metadata["cooktop.test.strings"] == ["ok", "\ufffd\ufffd bytes", "é"]
    # the exact bytes stay in the reader
    assert g.raw["general.name"].value == LATIN1_NAME


def test_cooktop_info_shows_the_name(latin1_model):
    r = subprocess.run([sys.executable, "-m", "cooktop.cli", "info", str(latin1_model)], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "name:           Caf\ufffd model" in r.stdout


def test_llama_loads_and_generates(latin1_model):
    from cooktop.api import Llama

    llm = Llama(str(latin1_model), device="cpu", verbose=False)
    out = llm("Once upon a time", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert len(out.split()) >= 3


def _key_bytes_file(path, key: bytes) -> str:
    """A minimal GGUF v3 file: no tensor, one UINT32 metadata value under the raw ``key``."""
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    body += struct.pack("<II", int(GGUFValueType.UINT32), 7)
    path.write_bytes(body)
    return str(path)


def test_non_utf8_key_is_corrupt(tmp_path):
    path = _key_bytes_file(tmp_path / "badkey.gguf", b"general.\xe9")
    with pytest.raises(GGUFError, match=r"metadata key #0 is not valid UTF-8; the file is corrupt"):
        open_gguf(path)
    assert open_gguf(_key_bytes_file(tmp_path / "ok.gguf", b"general.ok")).metadata == {"general.ok": 7}
