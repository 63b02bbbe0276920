"""``cooktop.tools.hub``: downloads through a local Hub-compatible HTTP server.

The server (``http.server`` on 127.0.0.1, random port) answers HEAD and GET of
``/{owner}/{repo}/resolve/{revision}/{filename}`` with the headers
huggingface_hub's ``get_hf_file_metadata`` reads (file_download.py):
``X-Repo-Commit`` (required), ``ETag`` / ``X-Linked-Etag`` (required; the blob
name in the cache), ``Content-Length`` / ``X-Linked-Size`` (expected size).
huggingface_hub reads ``HF_ENDPOINT``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE``
when it is imported, so every resolve runs in a fresh subprocess with its env.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest

from cooktop.errors import CooktopError
from cooktop.tools import hub

PYTHON = sys.executable
COOKTOP = str(pathlib.Path(sys.executable).parent / "cooktop")
COMMIT = "1234567890abcdef1234567890abcdef12345678"


class HubServer:
    """A minimal Hub file server: ``files[(repo, filename)] = bytes``; ``requests`` logs (method, path)."""

    def __init__(self):
        self.files: dict[tuple[str, str], bytes] = {}
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _lookup(self):
                outer.requests.append((self.command, self.path))
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) >= 5 and parts[2] == "resolve":
                    key = ("/".join(parts[:2]), "/".join(parts[4:]))
                    if key in outer.files:
                        return outer.files[key]
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None

            def _headers(self, body: bytes):
                sha = hashlib.sha256(body).hexdigest()
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(body)))
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()

            def do_HEAD(self):
                body = self._lookup()
                if body is not None:
                    self._headers(body)

            def do_GET(self):
                body = self._lookup()
                if body is not None:
                    self._headers(body)
                    self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def gets(self) -> int:
        return sum(1 for m, _ in self.requests if m == "GET")

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = HubServer()
    yield s
    s.stop()


def _env(endpoint: str, cache: pathlib.Path, offline: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.pop("TRANSFORMERS_OFFLINE", None)
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf_home"),
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


_RESOLVE = """
import json, sys
from cooktop.errors import CooktopError
from cooktop.tools import hub
args = json.loads(sys.argv[1])
try:
    print(json.dumps({"path": hub.resolve(*args)}))
except CooktopError as e:
    print(json.dumps({"error": str(e)}))
"""


def resolve_in_subprocess(env: dict[str, str], *args) -> dict:
    """Run ``hub.resolve(*args)`` with ``env``; returns {"path": ...} or {"error": message}."""
    res = subprocess.run([PYTHON, "-c", _RESOLVE, json.dumps(list(args))], capture_output=True, text=True,
                         timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- tests ---------------------------------------------------------------------
def test_download_then_cache(server, stories, tmp_path):
    body = stories.read_bytes()
    server.files[("owner/repo", "model.gguf")] = body
    cache = tmp_path / "hub"
    env = _env(server.url, cache)
    sha = hashlib.sha256(body).hexdigest()

    first = resolve_in_subprocess(env, "owner/repo", "model.gguf", sha)
    assert "path" in first, first
    assert server.gets() == 1
    path = pathlib.Path(first["path"])
    assert path.read_bytes() == body
    assert cache in path.parents
    assert (cache / "models--owner--repo" / "snapshots" / COMMIT / "model.gguf").exists()
    assert (cache / "models--owner--repo" / "refs" / "main").read_text() == COMMIT

    n_requests = len(server.requests)
    second = resolve_in_subprocess(env, "owner/repo", "model.gguf", sha)
    assert second == first
    assert len(server.requests) == n_requests  # served from the cache: not even a HEAD

    server.stop()  # and without any server at all
    third = resolve_in_subprocess(env, "owner/repo", "model.gguf")
    assert third == first


def test_sha256_mismatch(server, stories, tmp_path):
    server.files[("owner/repo", "model.gguf")] = stories.read_bytes()
    out = resolve_in_subprocess(_env(server.url, tmp_path / "hub"), "owner/repo", "model.gguf", "0" * 64)
    assert "error" in out, out
    assert "sha256" in out["error"] and "0" * 64 in out["error"] and "\n" not in out["error"]


def test_default_model_checked_against_its_sha256(server, stories, tmp_path):
    """A wrong file served as ggml-org/tiny-llamas/stories260K.gguf is refused (known sha256)."""
    server.files[(hub.DEFAULT_REPO, hub.DEFAULT_FILE)] = stories.read_bytes()[:-1] + b"x"
    out = resolve_in_subprocess(_env(server.url, tmp_path / "hub"))
    assert "error" in out and hub.DEFAULT_SHA256 in out["error"], out


def test_missing_file_on_server(server, tmp_path):
    out = resolve_in_subprocess(_env(server.url, tmp_path / "hub"), "owner/repo", "nope.gguf")
    assert "error" in out, out
    msg = out["error"]
    assert "nope.gguf" in msg and "owner/repo" in msg and "-m" in msg and "\n" not in msg
    assert "not found (HTTP 404)" in msg


def test_unreachable_endpoint_fails_fast(tmp_path):
    endpoint = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    out = resolve_in_subprocess(_env(endpoint, tmp_path / "hub"), "owner/repo", "model.gguf")
    elapsed = time.monotonic() - t0
    assert "error" in out, out
    msg = out["error"]
    assert "\n" not in msg
    assert endpoint in msg and "model.gguf" in msg
    assert "-m" in msg and "--seed" in msg  # says how to fix it
    assert elapsed < 20, f"took {elapsed:.1f} s (huggingface_hub retry back-off?)"


def test_offline_without_cache(tmp_path):
    out = resolve_in_subprocess(_env("http://127.0.0.1:9", tmp_path / "hub", offline=True), "owner/repo", "m.gguf")
    assert "error" in out and "HF_HUB_OFFLINE" in out["error"] and "--seed" in out["error"], out


def test_seed_then_offline_resolve(stories, tmp_path):
    cache = tmp_path / "hub"
    env = _env("http://127.0.0.1:9", cache, offline=True)
    res = subprocess.run([PYTHON, "-m", "cooktop.tools.hub", "--seed", str(stories)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    seeded = pathlib.Path(res.stdout.strip())
    assert cache in seeded.parents and seeded.read_bytes() == stories.read_bytes()
    out = resolve_in_subprocess(env)
    assert out == {"path": str(seeded)}


def test_seed_refuses_wrong_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF not really")
    env = _env("http://127.0.0.1:9", tmp_path / "hub", offline=True)
    res = subprocess.run([PYTHON, "-m", "cooktop.tools.hub", "--seed", str(bad)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 1
    assert res.stderr.startswith("error: ") and "sha256" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "hub").exists() or not any((tmp_path / "hub").rglob("*.gguf"))


def test_cli_run_hf(server, stories, tmp_path):
    server.files[("owner/repo", "tiny.gguf")] = stories.read_bytes()
    env = _env(server.url, tmp_path / "hub")
    # llama.cpp's --offline: only the cache, the Hub not even asked
    off = subprocess.run([COOKTOP, "run", "--offline", "-hf", "owner/repo:tiny.gguf", "-p", "Once", "-n", "2",
                          "--device", "cpu"], capture_output=True, text=True, timeout=60, env=env)
    assert off.returncode == 1 and "downloads are off (--offline" in off.stderr, off.stderr
    assert server.requests == []
    res = subprocess.run([COOKTOP, "run", "-hf", "owner/repo:tiny.gguf", "-p", "Once upon a time", "-n", "6",
                          "--temp", "0", "--device", "cpu"], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert server.gets() == 1
    assert res.stdout.startswith("Once upon a time")
    assert len(res.stdout.strip()) > len("Once upon a time")
    # --hf-file form, now from the cache
    res2 = subprocess.run([COOKTOP, "run", "-hf", "owner/repo", "--hf-file", "tiny.gguf", "-p", "Once upon a time",
                           "-n", "6", "--temp", "0", "--device", "cpu"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert res2.returncode == 0, res2.stderr
    assert res2.stdout == res.stdout
    assert server.gets() == 1


@pytest.mark.parametrize("spec,words", [("badrepo", ("bad -hf repo", "OWNER/REPO")),
                                        ("owner/repo", ("not in the Hugging Face cache", "HF_HUB_OFFLINE")),
                                        ("owner/repo:", ("empty quant tag",))])
def test_cli_run_hf_bad_spec(tmp_path, spec, words):
    env = _env("http://127.0.0.1:9", tmp_path / "hub", offline=True)
    res = subprocess.run([COOKTOP, "run", "-hf", spec, "-p", "hi", "-n", "1"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0]


def test_cli_run_hf_unreachable(tmp_path):
    env = _env(f"http://127.0.0.1:{_free_port()}", tmp_path / "hub")
    res = subprocess.run([COOKTOP, "run", "-hf", "owner/repo:x.gguf", "-p", "hi", "-n", "1"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--seed" in lines[0], res.stderr


# -- parse_hf ------------------------------------------------------------------------
def test_parse_hf():
    assert hub.parse_hf("owner/repo:file.gguf") == ("owner/repo", "file.gguf")
    assert hub.parse_hf("owner/repo", "f.gguf") == ("owner/repo", "f.gguf")
    assert hub.parse_hf("owner/repo:a.gguf", "b.gguf") == ("owner/repo", "b.gguf")
    assert hub.parse_hf("owner/repo:sub/dir/f.gguf") == ("owner/repo", "sub/dir/f.gguf")


@pytest.mark.parametrize("spec", ["badrepo", "badrepo:f.gguf", "/repo:f.gguf", "owner/:f.gguf", "a/b/c:f.gguf",
                                  "owner/repo", "owner/repo:", "owner/repo:Q4_K_M"])
def test_parse_hf_errors(spec):
    with pytest.raises(CooktopError) as ei:
        hub.parse_hf(spec)
    msg = str(ei.value)
    assert "\n" not in msg and spec.split(":")[0] in msg
    assert ("OWNER/REPO" in msg) or ("--hf-file" in msg)


def test_parse_hf_spec_quant_tags():
    """llama.cpp's -hf: the part after ':' is a quant tag unless it names a .gguf file."""
    assert hub.parse_hf_spec("owner/repo") == ("owner/repo", None, None)
    assert hub.parse_hf_spec("owner/repo:Q4_K_M") == ("owner/repo", None, "Q4_K_M")
    assert hub.parse_hf_spec("owner/repo:f.gguf") == ("owner/repo", "f.gguf", None)
    assert hub.parse_hf_spec("owner/repo:q8_0", "x.gguf") == ("owner/repo", "x.gguf", None)
    with pytest.raises(CooktopError, match="empty quant tag"):
        hub.parse_hf_spec("owner/repo:")


FILES = ["README.md", "m-Q2_K.gguf", "m-Q4_K.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-Q4_K_M.gguf",
         "big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf"]


@pytest.mark.parametrize("tag,want", [(None, "m-Q4_K_M.gguf"), ("Q4_K_M", "m-Q4_K_M.gguf"),
                                      ("q4_k", "m-Q4_K.gguf"), ("Q8_0", "m-Q8_0.gguf"),
                                      ("Q6_K", "big/m-Q6_K-00001-of-00002.gguf")])
def test_pick_gguf(tag, want):
    assert hub.pick_gguf(FILES, tag) == want


def test_pick_gguf_defaults_and_errors():
    assert hub.pick_gguf(["a-F16.gguf", "a-Q4_0.gguf"], None) == "a-Q4_0.gguf"
    assert hub.pick_gguf(["only.gguf"], None) == "only.gguf"
    with pytest.raises(CooktopError, match="no GGUF for quant 'Q3_K_S'.*m-Q2_K.gguf"):
        hub.pick_gguf(FILES, "Q3_K_S", "owner/repo")
    with pytest.raises(CooktopError, match="no GGUF file"):
        hub.pick_gguf(["README.md"], None, "owner/repo")


def _seed_cache(cache: pathlib.Path, repo: str, files: dict[str, pathlib.Path]) -> None:
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / COMMIT
    for name, src in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_bytes(src.read_bytes())
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)


@pytest.mark.parametrize("spec,want", [("owner/repo", "Q4_K_M"), ("owner/repo:Q8_0", "Q8_0"),
                                       ("owner/repo:q8_0", "Q8_0")])
def test_cli_run_hf_quant_from_cache(stories, tmp_path, spec, want):
    """-hf owner/repo[:QUANT] offline, from the cache: the file with the tag, Q4_K_M by default."""
    tiny = pathlib.Path(str(stories)).parent / "tiny"
    _seed_cache(tmp_path / "hub", "owner/repo", {"m-Q4_K_M.gguf": tiny / "tiny-Q4_K_M.gguf",
                                                 "m-Q8_0.gguf": tiny / "tiny-Q8_0.gguf"})
    env = _env("http://127.0.0.1:9", tmp_path / "hub", offline=True)
    res = subprocess.run([COOKTOP, "run", "-hf", spec, "-p", "Once", "-n", "2", "--temp", "0", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert f"m-{want}.gguf" in res.stderr


def test_pick_mmproj():
    """The repo's projector for -hf with an image: the only one; else the model's folder, its quant
    tag, then F16 > BF16 > F32 > Q8_0; None without one (the model pick never takes it)."""
    assert hub.pick_mmproj(["m-Q4_K_M.gguf", "README.md"]) is None
    assert hub.pick_mmproj(["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf"], "m-Q4_K_M.gguf") == "mmproj-m-Q8_0.gguf"
    two = ["m-Q8_0.gguf", "mmproj-m-F32.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-f16.gguf"]
    assert hub.pick_mmproj(two, "m-Q8_0.gguf") == "mmproj-m-Q8_0.gguf"
    assert hub.pick_mmproj(two, "m-Q4_K_M.gguf") == "mmproj-m-f16.gguf"
    assert hub.pick_mmproj(["a/mmproj-F16.gguf", "b/mmproj-F16.gguf"], "b/m-Q4_0.gguf") == "b/mmproj-F16.gguf"
    assert hub.pick_gguf(two, None) == "m-Q8_0.gguf"


def test_cli_run_hf_fetches_the_repo_projector_for_an_image(tmp_path):
    """-hf with --image and no --mmproj (offline, from the cache): the repo's mmproj is used and
    named; --no-mmproj, or a repo without one, is the clear --mmproj error."""
    from PIL import Image

    from cooktop.tools import synth_mmproj

    model, mmproj = synth_mmproj.write_mlp_pair(tmp_path)
    _seed_cache(tmp_path / "hub", "owner/llava", {"llava-F32.gguf": pathlib.Path(model),
                                                   "mmproj-llava-f32.gguf": pathlib.Path(mmproj)})
    _seed_cache(tmp_path / "hub", "owner/text", {"text-F32.gguf": pathlib.Path(model)})
    img = tmp_path / "img.png"
    Image.new("RGB", (30, 20), (200, 10, 10)).save(img)
    env = _env("http://127.0.0.1:9", tmp_path / "hub", offline=True)
    base = ["run", "-p", "look: <__media__>", "-n", "2", "--temp", "0", "--device", "cpu", "--image", str(img)]
    res = subprocess.run([COOKTOP, *base, "-hf", "owner/llava"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert "cooktop: vision projector mmproj-llava-f32.gguf from owner/llava" in res.stderr
    for args in (["-hf", "owner/llava", "--no-mmproj"], ["-hf", "owner/text"]):
        res = subprocess.run([COOKTOP, *base, *args], capture_output=True, text=True, timeout=120, env=env)
        assert res.returncode == 1 and "--image needs --mmproj FILE" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    assert "owner/text has no mmproj*.gguf" in res.stderr
