"""``cooktop chat`` (and ``cooktop run -cnv``): an interactive conversation through the chat template.

Like llama-cli's conversation mode: ``-sys`` sets the system message, ``-p``
is the first user message, each answer streams as it is generated, ``/exit``
(or end of input) ends the session, Ctrl-C stops the current answer and
returns to the prompt (a second Ctrl-C at the prompt ends the session).
Colours (prompt marker and user text) only when stdout is a terminal and
``NO_COLOR`` is not set. Works driven through a pipe: one user message per
line; a line ending in ``\\`` continues on the next.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import click

from ..errors import ContextOverflowError, CooktopError
from .common import (
    device_options,
    kv_kwargs,
    kv_options,
    model_options,
    moe_kwargs,
    parse_ngl,
    ray_option,
    read_prompt_file,
    resolve_model,
    threads_option,
)
from .group import cli
from .llama_flags import llama_options
from .lora_options import lora_options
from .sampling_options import chat_generation, generation_options

GREEN, RESET = "\033[32m", "\033[0m"


def _colour(out: TextIO) -> bool:
    return bool(getattr(out, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


def _read_message(inp: TextIO, out: TextIO, colour: bool) -> str | None:
    """One user message (lines ending in a backslash continue it); None at end of input."""
    lines: list[str] = []
    out.write("\n" + GREEN + "> " if colour else "\n> ")
    out.flush()
    while True:
        line = inp.readline()
        if not line:
            if colour:
                out.write(RESET)
            return None if not lines else "\n".join(lines)
        line = line.rstrip("\n")
        if line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        if colour:
            out.write(RESET)
            out.flush()
        return "\n".join(lines)


def chat_loop(llm: Any, gen: dict[str, Any], system: str | None = None, first: str | None = None,
              inp: TextIO | None = None, out: TextIO | None = None, single_turn: bool = False) -> int:
    """Run a conversation until ``/exit`` or end of input; returns the exit code.

    Args:
        llm: a loaded :class:`cooktop.api.Llama`.
        gen: keyword arguments for ``create_chat_completion`` (sampling, max_tokens).
        system: the system message (``-sys``); first: the first user message (``-p``).
        single_turn: end after the first answer (llama-cli ``-st``).
    """
    inp = inp or sys.stdin
    out = out or sys.stdout
    colour = _colour(out)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    llm.chat_template_choice()  # template problems show before the first prompt
    pending = first
    while True:
        if pending is None:
            try:
                text = _read_message(inp, out, colour)
            except KeyboardInterrupt:
                out.write((RESET if colour else "") + "\n")
                return 0
            if text is None:
                out.write("\n")
                return 0
        else:
            text, pending = pending, None
            out.write(f"\n> {text}\n")
        if text.strip() in ("/exit", "/quit"):
            return 0
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        answer: list[str] = []
        try:
            stream = llm.create_chat_completion(messages, stream=True, **gen)
        except ContextOverflowError as e:
            click.echo(f"error: the conversation is too long for the context: {e}", err=True)
            return 1
        try:
            for chunk in stream:
                piece = chunk["choices"][0]["delta"].get("content") or ""
                if piece:
                    answer.append(piece)
                    out.write(piece)
                    out.flush()
        except KeyboardInterrupt:
            stream.close()
            out.write("\n[answer stopped]")
        out.write("\n")
        out.flush()
        if single_turn:
            return 0
        messages.append({"role": "assistant", "content": "".join(answer)})


def open_chat_model(path: str, n_ctx: int, n_batch: int, device: str | None, n_gpu_layers: str,
                    split: str | None, seed: int, threads: int | None, threads_batch: int | None,
                    chat_template: str | None, chat_template_file: str | None, ray_address: str | None = None,
                    tensors=None, kv=None, lora=None):
    """A :class:`cooktop.api.Llama` for a chat session, with the load summary on stderr (``kv``: a
    ``KVConfig`` of -ctk/-ctv/-fa, None: the defaults; ``lora``: ``[(path, scale)]`` of --lora / --lora-scaled)."""
    from ..api import Llama
    llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_batch, device=device,
                n_gpu_layers=parse_ngl(n_gpu_layers), split=split, seed=seed, n_threads=threads,
                n_threads_batch=threads_batch, verbose=False, chat_template=chat_template,
                chat_template_file=chat_template_file, ray_address=ray_address, **moe_kwargs(tensors),
                **(kv_kwargs(kv) if kv is not None else {}), **({"lora_adapters": lora} if lora else {}))
    click.echo(f"cooktop: {path}: {llm._engine.placement.summary()}", err=True)
    choice = llm.chat_template_choice()
    click.echo(f"cooktop: chat template: {choice.template.name}", err=True)
    return llm


def chat_options(f):
    """Options shared by ``chat`` and ``run -cnv``."""
    f = click.option("-st", "--single-turn", "single_turn", is_flag=True,
                     help="End after the first answer.")(f)
    f = click.option("--chat-template-file", default=None, type=click.Path(),
                     help="Jinja chat template file (overrides the model's).")(f)
    f = click.option("--chat-template", default=None,
                     help="Chat format name (chatml, llama3, ...) or jinja text (overrides the model's).")(f)
    f = click.option("-sys", "--system-prompt", "system", default=None, help="System message.")(f)
    return f


@cli.command("chat")
@llama_options("chat")
@model_options
@chat_options
@click.option("-p", "--prompt", default=None, help="First user message.")
@click.option("-f", "--file", "prompt_file", type=click.File("r"), default=None,
              help="Read the first user message from a file.")
@click.option("-n", "--n-predict", "n_predict", default=-1, show_default=True,
              help="Max tokens per answer (-1 = until end of turn or full context).")
@click.option("-c", "--ctx-size", "n_ctx", default=0, show_default=True,
              help="Context size in tokens (0 = from the model, at most 4096).")
@click.option("-b", "--batch-size", "n_batch", default=512, show_default=True, help="Prompt tokens per forward pass.")
@generation_options
@click.option("-s", "--seed", default=-1, show_default=True, help="RNG seed (-1 = random).")
@threads_option
@kv_options
@lora_options
@device_options
@ray_option
def chat_cmd(model, hf_repo, hf_file, single_turn, system, chat_template, chat_template_file, prompt, prompt_file,
             n_predict, n_ctx, n_batch, seed, threads, threads_batch, device, n_gpu_layers, split, ray_address,
             tensors, kv, lora, **gen_opts):
    """Chat with a model through its chat template (like llama-cli -cnv).

    Every other llama-cli option is accepted; those cooktop does not act on say so in one line.
    """
    if n_predict < -1:
        raise CooktopError(f"-n must be >= -1 (-1 = until the end of the turn), got {n_predict}")
    if prompt_file is not None:
        prompt = read_prompt_file(prompt_file)
    path = resolve_model(model, hf_repo, hf_file)
    llm = open_chat_model(path, n_ctx, n_batch, device, n_gpu_layers, split, seed, threads, threads_batch,
                          chat_template, chat_template_file, ray_address, tensors, kv, lora)
    sys.exit(chat_loop(llm, chat_generation(llm, n_predict, gen_opts), system, prompt, single_turn=single_turn))
