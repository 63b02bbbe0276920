"""llama-server's built-in agent tools (``--tools``, tools/server/server-tools.cpp and its
tests/unit/test_tools_builtin.py): ``GET`` / ``POST /tools``, each tool's answer and refusals, the streamed
shell, the runtime checks, and the confinement of the file tools to the ``x-tool-cwd`` folder."""

from __future__ import annotations

import json
import os
import time

import pytest
from serverutil import RunningServer


@pytest.fixture(scope="module")
def servers(stories, server_deps):
    from cooktop.server.app import ServerConfig
    on = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=64, device="cpu"), tools="all"))
    off = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=64, device="cpu")))
    yield on, off
    on.stop()
    off.stop()


@pytest.fixture
def call(servers, tmp_path):
    """POST /tools with x-tool-cwd = a fresh folder ``tmp_path / "root"``: (status, body)."""
    import httpx

    root = tmp_path / "root"
    root.mkdir()

    def go(tool, params, headers=None, cwd=True, stream=None):
        h = {"x-tool-cwd": str(root)} if cwd else {}
        h.update(headers or {})
        body = {"tool": tool, "params": params}
        if stream is not None:
            body["stream"] = stream
        r = httpx.post(servers[0].base + "/tools", json=body, headers=h, timeout=30)
        return r.status_code, (r.text if r.headers["content-type"].startswith("text/event-stream") else r.json())

    go.root, go.base = root, servers[0].base
    return go


def test_disabled_and_listing(servers):
    import httpx

    on, off = servers
    disabled = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
    for r in (httpx.get(off.base + "/tools"), httpx.post(off.base + "/tools", json={"tool": "read_file"})):
        assert r.status_code == 403 and r.json() == disabled
    listing = httpx.get(on.base + "/tools").json()
    assert [t["tool"] for t in listing] == ["read_file", "file_glob_search", "grep_search", "exec_shell_command",
                                            "write_file", "edit_file", "get_info"]
    shell = listing[3]
    assert shell["display_name"] == "Execute shell command" and shell["permissions"] == {"write": True}
    assert shell["type"] == "server" and shell["uses_cwd"] is True
    assert shell["definition"]["function"]["parameters"]["required"] == ["command"]
    assert listing[0]["permissions"] == {"write": False}


def test_bad_requests(servers, call):
    import httpx

    r = httpx.post(servers[0].base + "/tools", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert call("nope", {}) == (404, {"error": {"code": 400, "message": 'unknown tool "nope"',
                                                "type": "invalid_request_error"}})
    status, body = call("read_file", {"path": "x"}, stream=True)
    assert status == 404 and body["error"]["message"] == 'tool "read_file" does not support stream = true'
    status, body = call("read_file", {})
    assert status == 400 and body["error"]["message"] == 'missing or invalid parameter "path" (expected str)'


def test_write_read_edit(call):
    root = call.root
    assert call("write_file", {"path": "sub/a.txt", "content": "line1\nline2\nline3\n"}) == (
        200, {"result": "file written successfully", "path": "sub/a.txt", "bytes": 18})
    assert (root / "sub" / "a.txt").read_text() == "line1\nline2\nline3\n"
    assert call("read_file", {"path": "sub/a.txt"})[1] == {"plain_text_response": "line1\nline2\nline3\n"}
    assert call("read_file", {"path": str(root / "sub/a.txt"), "start_line": 2, "end_line": 3,
                              "append_loc": True})[1] == {"plain_text_response": "2\u2192line2\n3\u2192line3\n"}
    # a model-sent cwd is dropped: the header's folder is used
    assert call("read_file", {"path": "sub/a.txt", "cwd": "/definitely/not"})[1]["plain_text_response"].startswith("l")
    assert call("read_file", {"path": "sub/a.txt"}, headers={"x-resp-type": "base64"})[1] == {
        "base64": "bGluZTEKbGluZTIKbGluZTMK", "size_bytes": 18}
    assert call("read_file", {"path": "missing.txt"})[1] == {"error": "cannot stat file: missing.txt"}
    (root / "big.txt").write_text("x" * 20000)
    assert call("read_file", {"path": "big.txt"})[1] == {"error": "file too large (20000 bytes, max 16384). "
                                                                   "Use start_line/end_line to read a portion."}

    edits = [{"old_text": "line2", "new_text": "line2-edited"}, {"old_text": "line3\n", "new_text": "line3\nline4\n"}]
    assert call("edit_file", {"path": "sub/a.txt", "edits": edits})[1] == {
        "result": "file edited successfully", "path": "sub/a.txt", "edits_applied": 2}
    assert (root / "sub" / "a.txt").read_text() == "line1\nline2-edited\nline3\nline4\n"

    def err(edits):
        return call("edit_file", {"path": "sub/a.txt", "edits": edits})[1]["error"]

    assert err([{"old_text": "line", "new_text": "x"}]) == \
        "found 4 occurrences of edits[0].old_text in sub/a.txt, it must be unique"
    assert err([{"old_text": "line1\nline2", "new_text": "a"}, {"old_text": "2-edited", "new_text": "b"}]) == \
        "edits[0] and edits[1] overlap in sub/a.txt; merge them into one edit or target disjoint regions"
    assert err([{"old_text": "zzz", "new_text": "a"}]) == \
        "could not find edits[0].old_text in sub/a.txt, it must match the file's current content exactly"
    assert err([{"old_text": "line1", "new_text": "line1"}]) == \
        "no changes made: the replacement(s) produced identical content"
    assert err([]) == '"edits" must be a non-empty array'
    assert err([{"old_text": "", "new_text": "a"}]) == "edits[0].old_text must not be empty"
    # fuzzy: smart quotes and trailing blanks in the file, ASCII in old_text; untouched lines kept verbatim
    (root / "q.txt").write_text("keep \u201cme\u201d  \nsay \u201chi\u201d  \n")
    assert call("edit_file", {"path": "q.txt", "edits": [{"old_text": 'say "hi"', "new_text": "bye"}]})[1][
        "edits_applied"] == 1
    assert (root / "q.txt").read_text() == "keep \u201cme\u201d  \nbye\n"


def test_confinement(call, tmp_path):
    root = call.root
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside / "secret.txt", root / "link.txt")
    os.symlink(outside, root / "linkdir")
    (root / "in.txt").write_text("secret inside\n")
    os.symlink(root / "in.txt", root / "ok_link.txt")
    msg = f"path is outside the tools root ({os.path.realpath(root)}): "
    for tool, extra in (("read_file", {}), ("write_file", {"content": "x"}),
                        ("edit_file", {"edits": [{"old_text": "s", "new_text": "t"}]}),
                        ("grep_search", {"pattern": "secret"}), ("file_glob_search", {})):
        for path in ("../outside/secret.txt", str(outside / "secret.txt"), "link.txt", "linkdir/secret.txt",
                     "linkdir", "~"):
            if tool in ("read_file", "write_file", "edit_file") and path in ("linkdir", "~"):
                continue
            assert call(tool, {"path": path, **extra}) == (200, {"error": msg + path}), (tool, path)
    assert call("write_file", {"path": "linkdir/new.txt", "content": "x"})[1] == {"error": msg + "linkdir/new.txt"}
    os.symlink(outside / "dangling.txt", root / "dangling.txt")  # a link to a file not made yet
    assert call("write_file", {"path": "dangling.txt", "content": "x"})[1] == {"error": msg + "dangling.txt"}
    assert not (outside / "new.txt").exists() and not (outside / "dangling.txt").exists()
    assert (outside / "secret.txt").read_text() == "secret"
    # a link that stays inside is followed; listings and grep skip the ones leading out
    assert call("read_file", {"path": "ok_link.txt"})[1] == {"plain_text_response": "secret inside\n"}
    listed = call("file_glob_search", {"path": ".", "type": "all"})[1]
    assert sorted(e["path"] for e in listed["entries"]) == ["in.txt", "ok_link.txt"]
    text = call("grep_search", {"path": ".", "pattern": "secret"})[1]["plain_text_response"]
    assert sorted(text.split("\n")) == ["", "", "---", "Total matches: 2", "in.txt:secret inside",
                                        "ok_link.txt:secret inside"]
    assert call("read_file", {"path": "x"}, headers={"x-tool-cwd": str(tmp_path / "nope")})[1] == {
        "error": f"x-tool-cwd is not a directory: {tmp_path / 'nope'}"}
    # no header: the server's working folder is the root
    info = call("get_info", {}, cwd=False)[1]
    assert info["cwd"] == os.path.realpath(os.getcwd()) and info["os"].startswith(os.uname().sysname)


def test_glob_search(call):
    root = call.root
    for p in ("project-alpha/src/main.cpp", "project-beta/README.md", "top.txt", "a/mid.txt", "a/b/deep.txt",
              "build/artifact.txt", "node_modules/x/y.txt"):
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text("x\n")
    res = call("file_glob_search", {"path": ".", "type": "dir"})[1]
    types = {e["path"]: e["type"] for e in res["entries"]}
    assert set(types) == {"project-alpha", "project-alpha/src", "project-beta", "a", "a/b", "build", "node_modules"}
    assert set(types.values()) == {"dir"} and "project-alpha/src/\n" in res["plain_text_response"]
    assert res["base"] == os.path.realpath(root)
    res = call("file_glob_search", {"path": ".", "include": "*.txt", "max_depth": 1})[1]
    assert res["plain_text_response"] == "top.txt\n\n---\nTotal matches: 1\n"
    res = call("file_glob_search", {"path": ".", "include": "*.txt"})[1]
    assert sorted(e["path"] for e in res["entries"]) == ["a/b/deep.txt", "a/mid.txt", "top.txt"]  # junk skipped
    res = call("file_glob_search", {"path": ".", "include": "*.txt", "limit": 1})[1]
    assert len(res["entries"]) == 1 and res["plain_text_response"].endswith(
        "\n---\nTotal matches: 3\n[1 results limit reached (3 total matches). Refine the glob pattern to narrow "
        "the search.]\n")
    # a pattern with '/' is prefixed with "**/" (so it needs a folder above it, as llama.cpp's glob_match)
    res = call("file_glob_search", {"path": ".", "include": "b/*.txt"})[1]
    assert [e["path"] for e in res["entries"]] == ["a/b/deep.txt"]
    res = call("file_glob_search", {"path": "a", "include": "*.txt", "exclude": "deep*"})[1]
    assert [e["path"] for e in res["entries"]] == ["mid.txt"]
    os.close(os.open(os.path.join(os.fsencode(root), b"bad\xff.txt"), os.O_CREAT | os.O_WRONLY))
    res = call("file_glob_search", {"path": ".", "include": "bad*"})[1]
    assert res["plain_text_response"] == "bad\ufffd.txt\n\n---\nTotal matches: 1\n"
    assert call("file_glob_search", {"path": ".", "type": "x"})[1] == {
        "error": 'invalid type: x (expected "file", "dir" or "all")'}
    assert call("file_glob_search", {"path": ".", "limit": 0})[1] == {"error": "invalid limit: 0 (expected 1 or more)"}
    assert call("file_glob_search", {"path": "top.txt"})[1] == {
        "error": "path does not exist or is not a directory: top.txt"}


def test_grep_search(call):
    root = call.root
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("alpha\nneedle one\nbeta\n")
    (root / "src" / "b.txt").write_text("Needle two\n")
    text = call("grep_search", {"path": ".", "pattern": "needle", "include": "*.py",
                                "return_line_numbers": True})[1]["plain_text_response"]
    assert text == "src/a.py:2:needle one\n\n---\nTotal matches: 1\n"
    text = call("grep_search", {"path": "src", "pattern": "needle", "ignore_case": True,
                                "context_lines": 1, "include": "a.py"})[1]["plain_text_response"]
    assert text == "a.py-1-alpha\na.py:2:needle one\na.py-3-beta\n--\n\n---\nTotal matches: 1\n"
    text = call("grep_search", {"path": "src/b.txt", "pattern": "e.d", "literal": True})[1]["plain_text_response"]
    assert text == "\n---\nTotal matches: 0\n"
    assert call("grep_search", {"path": ".", "pattern": "("})[1]["error"].startswith("invalid regex: ")
    assert call("grep_search", {"path": "nope", "pattern": "x"})[1] == {"error": "path does not exist: nope"}


def test_shell(call):
    root = call.root
    out = call("exec_shell_command", {"command": "echo hi; echo err 1>&2; pwd; exit 3"})[1]
    assert out == {"plain_text_response": f"hi\nerr\n{os.path.realpath(root)}\n\n[exit code: 3]"}
    out = call("exec_shell_command", {"command": "echo 0123456789", "max_output_size": 5})[1]
    assert out == {"plain_text_response": "01234\n[output truncated]\n[exit code: 0]"}
    out = call("exec_shell_command", {"command": "echo start; sleep 5", "timeout": 1})[1]
    assert out == {"plain_text_response": "start\n\n[exit code: 1] [exit due to timed out]"}
    status, text = call("exec_shell_command", {"command": "echo hello; echo > made.txt"}, stream=True)
    events = [json.loads(x[len("data: "):]) for x in text.split("\n\n") if x]
    assert status == 200 and events[-1] == {"done": True}
    assert "".join(e["chunk"] for e in events[:-1]) == "hello\n\n[exit code: 0]"
    assert (root / "made.txt").exists()
    # a streaming client that leaves ends the command (its process group is killed)
    import httpx
    with httpx.stream("POST", call.base + "/tools", json={"tool": "exec_shell_command", "stream": True,
                                                         "params": {"command": "echo $$; sleep 30", "timeout": 60}},
                      timeout=30) as r:
        lines = r.iter_lines()  # kept: dropping the iterator closes the stream
        pid = int(json.loads(next(x for x in lines if x.startswith("data: "))[len("data: "):])["chunk"])
        assert _alive(pid)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid)
    status, text = call("exec_shell_command", {}, stream=True)
    assert json.loads(text[len("data: "):]) == {
        "done": True, "error": 'missing or invalid parameter "command" (expected str)'}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_runtimes(call):
    def err(spec):
        status, body = call("read_file", {"path": "x"}, headers={"x-tool-runtime": spec})
        assert status == 500 and body["error"]["type"] == "server_error"
        return body["error"]["message"]

    assert err("foo:bar") == "unknown tool runtime: foo:bar"
    assert err("ssh:-oProxyCommand=touch /tmp/pwned") == "invalid ssh target: -oProxyCommand=touch /tmp/pwned"
    assert err("ssh:") == "invalid ssh target: "
    assert err("docker-container:--privileged") == "invalid container id: --privileged"
    assert err("podman-container:a;b") == "invalid container id: a;b"
    assert err("docker:busybox") == "tool runtime must name a running container: docker:busybox"
    assert err("ssh:me@host.example") == ("tool runtime ssh:me@host.example: running tools in a container or over "
                                          "ssh is not supported by cooktop")
    status, text = call("exec_shell_command", {"command": "true"}, headers={"x-tool-runtime": "nope"}, stream=True)
    assert json.loads(text[len("data: "):]) == {"done": True, "error": "unknown tool runtime: nope"}


def test_router_serves_tools(tmp_path, server_deps):
    """Router mode answers /tools itself (llama-server's router does), behind its API key."""
    import httpx

    from cooktop.server.app import ServerConfig
    from cooktop.server.router import create_router_app
    (tmp_path / "models").mkdir()
    (tmp_path / "hub").mkdir()
    (tmp_path / "w.txt").write_text("from the router\n")
    app = create_router_app(ServerConfig("", tools="read_file", api_key="k"), str(tmp_path / "models"),
                            tmp_path / "hub")
    s = RunningServer(app=app)
    try:
        h = {"Authorization": "Bearer k", "x-tool-cwd": str(tmp_path)}
        assert httpx.post(s.base + "/tools", json={"tool": "read_file", "params": {"path": "w.txt"}}).status_code == 401
        r = httpx.post(s.base + "/tools", json={"tool": "read_file", "params": {"path": "w.txt"}}, headers=h)
        assert r.json() == {"plain_text_response": "from the router\n"}
        assert [t["tool"] for t in httpx.get(s.base + "/tools", headers=h).json()] == ["read_file"]
    finally:
        s.stop()


def test_cli_tools_flags(stories, monkeypatch, server_deps):
    """cooktop serve --tools: its startup checks, and --cors-origins defaulting to localhost with it."""
    from click.testing import CliRunner

    import cooktop.cli.serve as serve_mod  # registers the command
    import cooktop.server.app as app_mod
    from cooktop.cli.group import cli
    from cooktop.errors import CooktopError
    seen = []

    def fake_create_app(config, **kw):
        seen.append(config)
        raise CooktopError("stop here")

    monkeypatch.setattr(app_mod, "create_app", fake_create_app)
    monkeypatch.setattr(serve_mod, "listen_socket", lambda host, port: None)
    base = ["serve", "-m", str(stories), "--device", "cpu"]
    for extra, origins, tools in (([], "*", ""), (["--tools", "all"], "localhost", "all"),
                                  (["--tools", "read_file", "--cors-origins", "*"], "*", "read_file")):
        res = CliRunner().invoke(cli, base + extra)
        assert "stop here" in str(res.exception) or "stop here" in res.output, res.output
        assert (seen[-1].cors_origins, seen[-1].tools) == (origins, tools)
    res = CliRunner().invoke(cli, base + ["--tools", "nope"])
    assert res.exit_code != 0 and 'unknown tool "nope"' in (res.output + str(res.exception))
    res = CliRunner().invoke(cli, base + ["--tools", "all"], env={"LLAMA_ARG_TOOLS_RUNTIME": "docker-container:-x"})
    assert res.exit_code != 0 and "invalid container id: -x" in (res.output + str(res.exception))


def test_startup_checks():
    from cooktop.server.tools import check_tools_runtime, enabled_tools

    assert enabled_tools("") == []
    assert enabled_tools("edit_file,read_file") == ["read_file", "edit_file"]
    assert len(enabled_tools("all")) == 7
    with pytest.raises(ValueError, match='^unknown tool "nope". available tools: read_file, file_glob_search, '):
        enabled_tools("read_file,nope")
    with pytest.raises(ValueError, match=r"^--tools-runtime docker:<image> requires an image name$"):
        check_tools_runtime("docker:")
    with pytest.raises(ValueError, match="^invalid ssh target: -x$"):
        check_tools_runtime("ssh:-x")
    with pytest.raises(ValueError, match="not supported by cooktop$"):
        check_tools_runtime("podman:alpine")
