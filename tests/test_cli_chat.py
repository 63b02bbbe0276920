"""``cooktop chat`` / ``run -cnv`` driven through stdin and a pty, and llama.cpp's flag spellings."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from cooktop import Llama

PROMPT = "Once upon a time"


def cooktop(*args: str, stdin: str | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, NO_COLOR="1"))


def test_chat_through_stdin_matches_the_api(stories):
    r = cooktop("chat", "-m", str(stories), "-sys", "You are kind.", "-n", "12", "--temp", "0", "-c", "512",
                "--device", "cpu", stdin="Tell me a story.\nAnd then?\n/exit\nnever read\n")
    assert r.returncode == 0, r.stderr
    assert "chat template: chat format 'chatml'" in r.stderr and "\x1b[" not in r.stdout
    llm = Llama(model_path=str(stories), n_ctx=512, verbose=False, device="cpu")
    msgs = [{"role": "system", "content": "You are kind."}, {"role": "user", "content": "Tell me a story."}]
    a1 = llm.create_chat_completion(msgs, max_tokens=12, temperature=0)["choices"][0]["message"]["content"]
    msgs += [{"role": "assistant", "content": a1}, {"role": "user", "content": "And then?"}]
    a2 = llm.create_chat_completion(msgs, max_tokens=12, temperature=0)["choices"][0]["message"]["content"]
    assert r.stdout == f"\n> {a1}\n\n> {a2}\n\n> "
    llm.close()


def test_run_cnv_first_prompt_and_eof(stories):
    r = cooktop("run", "-m", str(stories), "-cnv", "-p", "Hello", "-n", "4", "--temp", "0", "--device", "cpu",
                stdin="")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("\n> Hello\n") and r.stdout.endswith("\n> \n")
    plain = cooktop("run", "-m", str(stories), "-no-cnv", "-p", PROMPT, "-n", "4", "--temp", "0", "--device", "cpu")
    assert plain.returncode == 0 and plain.stdout.startswith(PROMPT)


@pytest.mark.parametrize("flags,said", [
    (["-mg", "1"], "-mg 1 (--main-gpu) is not supported"),
    (["-sm", "row"], "-sm row (--split-mode) is not supported"),
    (["-ub", "256"], "-ub 256 (--ubatch-size) is not supported"),
    (["-np", "4"], "-np 4 (--parallel) is not supported"),
])
def test_llama_cpp_short_flags_not_supported(stories, flags, said):
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "-n", "2", "--temp", "0", "--device", "cpu", "-t", "1",
                *flags)
    assert r.returncode == 0, r.stderr
    assert said in r.stderr and "ignored" in r.stderr
    assert r.stdout.startswith(PROMPT)


def test_short_flags_that_cooktop_honours(stories):
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "-n", "2", "--temp", "0", "-dev", "cpu", "-ts", "1",
                "-ctk", "f32", "-mg", "0", "-sm", "layer", "-fa", "off", "-t", "2", "-tb", "2", "-ctv", "bf16")
    assert r.returncode == 0, r.stderr
    assert "not supported" not in r.stderr


def test_escapes_file_newline_and_special_tokens(stories, tmp_path):
    def out(*args):
        r = cooktop("run", "-m", str(stories), "-n", "4", "--temp", "0", "--device", "cpu", *args)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert out("-p", "Once\\nupon").startswith("Once\nupon")  # escapes on by default
    assert out("-p", "Once\\nupon", "--no-escape").startswith("Once\\nupon")
    f = tmp_path / "p.txt"
    f.write_text(PROMPT + "\n")
    assert out("-f", str(f)) == out("-p", PROMPT)  # one trailing newline dropped
    # "<s>" in the prompt is the BOS token, as llama-cli parses it
    assert out("-p", "<s>" + PROMPT, "--no-bos")[len("<s>"):] == out("-p", PROMPT)[len(""):]


def test_threads_flag_everywhere():
    for cmd in ("run", "chat", "serve", "bench"):
        r = cooktop(cmd, "--help")
        assert r.returncode == 0 and "-t, --threads" in r.stdout, cmd
    r = cooktop("serve", "--help")
    for flag in ("-np, --parallel", "--api-key", "--host", "--chat-template-file", "-a, --alias"):
        assert flag in r.stdout


def test_serve_bad_port(stories):
    r = cooktop("serve", "-m", str(stories), "--port", "70000")
    assert r.returncode == 1 and r.stderr.strip() == "error: --port must be in 1..65535, got 70000"


def _read_until(fd: int, needle: bytes, timeout: float = 60) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {needle!r}; got {buf[-400:]!r}")
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf


def _read_for(fd: int, seconds: float) -> bytes:
    """Whatever ``fd`` yields within ``seconds``."""
    buf = b""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf


def test_chat_in_a_pty_ctrl_c_stops_the_answer(stories):
    """On a terminal: colours on; Ctrl-C (SIGINT) during an answer stops it and the session goes on."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.Popen([sys.executable, "-m", "cooktop.cli", "chat", "-m", str(stories), "-c", "2048",
                             "-n", "-1", "--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0",
                             "--device", "cpu"], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    try:
        out = _read_until(master, b"> ")
        assert b"\x1b[32m" in out  # the prompt is coloured on a terminal
        # Interrupt an answer while it streams. stories260K may end an answer (EOS) before the
        # signal lands; then the next prompt comes back instead and we ask again.
        for _attempt in range(5):
            os.write(master, b"Tell me a very long story.\n")
            seen = _read_until(master, b"story.")  # the echoed line
            seen = seen.split(b"story.", 1)[1] + _read_for(master, 0.3)  # the answer is streaming
            if b"> " in seen:  # it already ended: ask again rather than interrupt the prompt
                continue
            proc.send_signal(signal.SIGINT)
            out = _read_until(master, b"> ")
            if b"[answer stopped]" in out:
                break
        assert b"[answer stopped]" in out
        assert proc.poll() is None  # still running
        os.write(master, b"/exit\n")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
