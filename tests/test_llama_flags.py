"""llama.cpp command lines on ``run``, ``chat`` and ``serve``: every arg.cpp option parses,
multi-letter single-dash flags stay whole, the meaningful ones act, the rest say "ignored"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from cooktop.cli.group import cli
from cooktop.cli.llama_flags import llama_options, load_table, options_for
from cooktop.cli.main import _register
from cooktop.errors import CooktopError

PROMPT = "Once upon a time"
_register()


def parse(command: str, *args: str, env: dict | None = None) -> dict:
    """The parameters ``cooktop COMMAND ARGS`` parses to (nothing runs)."""
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        with cli.make_context("cooktop", [command, *args], resilient_parsing=False) as parent:
            cmd = cli.commands[command]
            ctx = cmd.make_context(command, list(args), parent=parent)
            return dict(ctx.params)
    finally:
        os.environ.clear()
        os.environ.update(old)


def cooktop(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, NO_COLOR="1", **(env or {})))


def test_table_comes_from_arg_cpp():
    source, opts = load_table()
    assert "vendor/llama.cpp/common/arg.cpp" in source
    spellings = {s for o in opts for s in o.spellings}
    assert len(opts) > 300
    assert {"-cnv", "-mli", "-nkvo", "-st", "-sp", "-ngl", "-ctk", "-fa", "-cmoe", "-ot", "--mlock", "--no-mmap",
            "--jinja", "--no-webui", "-cb", "--threads-http", "--cache-reuse", "--pooling"} <= spellings


@pytest.mark.parametrize("command", ["run", "chat", "serve", "perplexity"])
def test_every_llama_cpp_option_parses(command, tmp_path):
    """Each spelling of each option of the command's llama.cpp programs, with dummy values."""
    prompt = tmp_path / "p.txt"
    prompt.write_text("x")
    owner = {s: p for p in cli.commands[command].params for s in [*p.opts, *p.secondary_opts]}
    for o in options_for(command):
        if o.key_of({"--help", "--version", "--completion-bash"}):
            continue
        for s in o.spellings:
            kind = getattr(owner.get(s), "type", None)
            value = str(prompt) if s in ("-f", "--file") else kind.choices[0] if isinstance(kind, click.Choice) \
                else "1"
            values = [value] * (o.nargs if s in o.args else 0)
            try:
                parse(command, s, *values)
            except click.ClickException as e:
                pytest.fail(f"{command} {s} {' '.join(values)}: {e.format_message()}")


def test_multi_letter_single_dash_flags_stay_whole():
    p = parse("chat", "-cnv", "-mli", "-nkvo", "-st", "-sp", "-ngl", "3", "-ctk", "q8_0", "-cmoe", "-ot", "x=CPU")
    assert p["n_ctx"] == 0 and p["single_turn"] is True and p["n_gpu_layers"] == "3"
    r = parse("run", "-cnv", "-no-cnv", "-ngl", "2")
    assert r["conversation"] is False and r["n_ctx"] == 0 and r["n_gpu_layers"] == "2"
    assert parse("run", "--ctx_size", "64", "--n_predict", "3")["n_ctx"] == 64  # llama.cpp reads _ as -


def test_spellings_of_implemented_options_are_aliases():
    p = parse("run", "--temperature", "0.3", "--predict", "7", "--gpu-layers", "auto", "-sp")
    assert p["temperature"] == 0.3 and p["n_predict"] == 7 and p["n_gpu_layers"] == "auto" and p["special"]


def test_serve_reads_llama_arg_variables():
    p = parse("serve", env={"LLAMA_ARG_CTX_SIZE": "333", "LLAMA_ARG_N_PARALLEL": "3", "LLAMA_ARG_PORT": "9999",
                            "LLAMA_ARG_TEMPERATURE": "0.25"})
    assert (p["n_ctx"], p["n_parallel"], p["port"], p["temperature"]) == (333, 3, 9999, 0.25)
    assert parse("run", env={"LLAMA_ARG_CTX_SIZE": "333"})["n_ctx"] == 0  # llama-server's variables only


def test_an_option_defined_elsewhere_is_never_shadowed():
    """Another module's real option (say ``-ot``) wins over the ignored table entry, with its aliases."""
    @click.command()
    @llama_options("run")
    @click.option("-ot", "override", default=None)
    def cmd(override):
        click.echo(f"override={override}")

    from click.testing import CliRunner
    r = CliRunner().invoke(cmd, ["--override-tensor", "blk=CPU", "--mlock"])
    assert r.exit_code == 0, r.output
    assert "override=blk=CPU" in r.output


@pytest.mark.parametrize("command,flags,said", [
    ("run", ["--mlock"], "--mlock is not supported by cooktop, ignored"),
    ("run", ["--no-mmap"], "--no-mmap is not supported by cooktop, ignored"),
    ("run", ["--color"], "-co on (--color) is not supported by cooktop, ignored"),
    ("run", ["-nkvo"], "-nkvo (--no-kv-offload) is not supported by cooktop, ignored"),
    ("run", ["-i"], "-i (--interactive) is not supported by cooktop, ignored"),
    ("run", ["--log-disable"], "--log-disable is not supported by cooktop, ignored"),
    ("run", ["--numa", "distribute"], "--numa distribute is not supported by cooktop, ignored"),
])
def test_ignored_flags_say_so_and_run(stories, command, flags, said):
    r = cooktop(command, "-m", str(stories), "-p", PROMPT, "-n", "2", "--temp", "0", "--device", "cpu", *flags)
    assert r.returncode == 0, r.stderr
    assert said in r.stderr and r.stdout.startswith(PROMPT)


def test_mmproj_is_taken_not_ignored(stories):
    """``-mm`` / ``--mmproj`` is cooktop's own option now (images): a missing file is an error naming it."""
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "-n", "2", "--device", "cpu", "-mm", "x.gguf")
    assert r.returncode == 1 and "x.gguf: no such file" in r.stderr and "ignored" not in r.stderr


def test_accepted_silently(stories):
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "-n", "2", "--temp", "0", "--device", "cpu", "--jinja",
                "--no-warmup", "-fa", "off", "--no-context-shift", "-v", "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    assert "not supported" not in r.stderr
    assert "number of tokens in prompt = 5" in r.stderr and "   403 -> ' Once'" in r.stderr


def _text(stories, *flags, prompt=PROMPT, n=24):
    r = cooktop("run", "-m", str(stories), "-p", prompt, "-n", str(n), "--temp", "0", "--device", "cpu", *flags)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def test_reverse_prompt_and_display_prompt(stories):
    full, _ = _text(stories)
    assert "girl" in full
    out, err = _text(stories, "-r", "girl", "--no-display-prompt")
    assert out == full[len(PROMPT):full.index("girl") + len("girl")] + "\n" and "finish reason: stop" in err


def test_ignore_eos(stories, tmp_path):
    """A copy of stories260K whose EOS is ',' (id 432, its first greedy token after the prompt)."""
    from conftest import rewrite_gguf
    from gguf import GGUFValueType
    m = rewrite_gguf(stories, tmp_path / "eos.gguf", drop=("tokenizer.ggml.eos_token_id",),
                     extra_kv=[("tokenizer.ggml.eos_token_id", 432, GGUFValueType.UINT32)])
    out, err = _text(m, n=8)
    assert out == PROMPT + "\n" and "finish reason: stop" in err
    out, err = _text(m, "--ignore-eos", n=8)
    assert out.startswith(PROMPT + " there") and "finish reason: length" in err and "/     7 runs" in err


def test_penalties_and_grammars_act(stories, tmp_path):
    plain, _ = _text(stories, n=40)
    pen, _ = _text(stories, "--presence-penalty", "1.5", "--frequency-penalty", "1.0", n=40)
    assert pen[:60] == plain[:60] and pen != plain  # it differs from the first repeated word
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= " yes" | " no"\n')
    for flags in (["--grammar", 'root ::= " yes" | " no"'], ["--grammar-file", str(g)]):
        out, _ = _text(stories, *flags)
        assert out[len(PROMPT):].strip() in ("yes", "no")
    out, _ = _text(stories, "-j", '{"type": "integer"}', n=8)
    assert isinstance(json.loads(out[len(PROMPT):]), int)


def test_ngl_negative_other_than_minus_one_refused(stories):
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "-n", "2", "-ngl", "-5", "--device", "cpu")
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        "error: bad -ngl / n_gpu_layers -5: layers cannot be negative (-1 = all, auto = as many as fit)")
    from cooktop import Llama
    from cooktop.errors import DeviceError
    with pytest.raises(DeviceError, match="cannot be negative"):
        Llama(model_path=str(stories), n_gpu_layers=-2, verbose=False)
    assert parse("run", "-ngl", "all")["n_gpu_layers"] == "all"


def test_chat_cnv_single_turn(stories):
    r = cooktop("chat", "-m", str(stories), "-cnv", "-st", "-mli", "-n", "4", "--temp", "0", "-c", "256",
                "--device", "cpu", "--keep", "4", stdin="Hello\nsecond\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("> ") == 1 and "-c nv" not in r.stderr and "-mli (--multiline-input)" in r.stderr
    assert "--keep 4 is not supported by cooktop, ignored" in r.stderr  # no context shift in chat


def test_context_shift_and_keep(stories):
    """--context-shift --keep N: a full context drops the older half after the first N tokens and
    generation goes on; the token after the shift is what the shifted context gives afresh."""
    out, err = _text(stories, "-c", "32", n=60)
    assert "/    27 runs" in err and "/    32 tokens" in err  # 5 prompt + 27 generated fill 32
    shifted, err = _text(stories, "-c", "32", "--context-shift", "--keep", "5", n=60)
    assert "finish reason: length" in err and "/    59 runs" in err  # 60 tokens in a context of 32
    assert shifted.startswith(out.rstrip("\n")) and len(shifted) > len(out)
    from cooktop.engine import generate as G
    from cooktop.engine.sampling import SamplingParams
    eng = G.load(str(stories), n_ctx=32, device="cpu")
    prompt = eng.tokenizer.tokenize(PROMPT, add_bos=True)
    res = eng.generate(prompt, 29, SamplingParams(temperature=0), n_keep=5).drain()
    ctx = prompt + res.tokens[:27]  # full: 32 tokens, keep 5, drop (32 - 5) // 2 = 13
    fresh = eng.new_sequence()
    logits = fresh.eval(ctx[:5] + ctx[5 + 13:])[-1]
    assert res.tokens[27] == int(logits.argmax())
    # the Python API and the server (Llama(context_shift=True, n_keep=5), serve --context-shift --keep 5)
    from cooktop.api import Llama
    llm = Llama(model_path=str(stories), n_ctx=32, context_shift=True, n_keep=5, verbose=False, device="cpu")
    api = llm.create_completion(PROMPT, max_tokens=29, temperature=0)
    assert api["usage"]["completion_tokens"] == 29 and api["choices"][0]["text"] == eng.tokenizer.detokenize(
        res.tokens).decode("utf-8", "replace")
    llm.close()
    with pytest.raises(CooktopError, match="n_keep"):
        Llama(model_path=str(stories), n_keep=-2, verbose=False, device="cpu")
    with pytest.raises(click.ClickException):
        parse("run", "--keep", "x")
    r = cooktop("run", "-m", str(stories), "-p", PROMPT, "--keep", "-2", "--device", "cpu")
    assert r.returncode == 1 and "--keep must be >= -1" in r.stderr
    eng.close()


def test_chat_reverse_prompt_and_sampling_flags(stories):
    """In a conversation -r ends the answer (a stop string), and the sampling flags reach it."""
    def answer(*flags):
        r = cooktop("chat", "-m", str(stories), "-st", "-n", "24", "--temp", "0", "-c", "256", "--device", "cpu",
                    *flags, stdin="Tell me a story.\n")
        assert r.returncode == 0, r.stderr
        return r.stdout
    full = answer()
    assert "." in full.strip("\n> ")
    cut = answer("-r", ".")
    assert cut == full[:full.index(".", 4)] + "\n"
    assert answer("--presence-penalty", "2", "--frequency-penalty", "2") != full
