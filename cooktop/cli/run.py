"""``cooktop run``: stream a continuation to stdout, llama.cpp-style timings to stderr."""

from __future__ import annotations

import sys

import click

from .. import engine as _engine
from ..model.sampling import SamplingParams
from .common import device_options, model_options, parse_ngl, resolve_model
from .main import cli


@cli.command("run")
@model_options
@click.option("-p", "--prompt", default="", help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.File("r"), default=None, help="Read the prompt from a file.")
@click.option("-n", "--n-predict", "n_predict", default=128, show_default=True,
              help="Tokens to generate (-1 = until the context is full).")
@click.option("-c", "--ctx-size", "n_ctx", default=0, show_default=True,
              help="Context size in tokens (0 = from the model, at most 4096).")
@click.option("-b", "--batch-size", "n_batch", default=512, show_default=True, help="Prompt tokens per forward pass.")
@click.option("--temp", "temperature", default=0.8, show_default=True, help="Temperature (<= 0: greedy).")
@click.option("--top-k", default=40, show_default=True)
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--min-p", default=0.05, show_default=True)
@click.option("--repeat-penalty", default=1.0, show_default=True)
@click.option("--repeat-last-n", default=64, show_default=True)
@click.option("-s", "--seed", default=-1, show_default=True, help="RNG seed (-1 = random).")
@click.option("-e", "--escape", is_flag=True, help="Process escapes (\\n, \\t) in the prompt.")
@click.option("--no-bos", is_flag=True, help="Do not prepend the BOS token.")
@click.option("--special", is_flag=True, help="Parse special tokens (<s>) in the prompt.")
@device_options
def run_cmd(model, hf_repo, hf_file, prompt, prompt_file, n_predict, n_ctx, n_batch, temperature, top_k, top_p,
            min_p, repeat_penalty, repeat_last_n, seed, escape, no_bos, special, device, n_gpu_layers, split):
    """Generate text from a prompt (like llama.cpp's llama-cli / llama-simple)."""
    path = resolve_model(model, hf_repo, hf_file)
    if prompt_file is not None:
        prompt = prompt_file.read()
    if escape:
        prompt = prompt.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
    eng = _engine.load(path, n_ctx=n_ctx, n_batch=n_batch, device=device,
                       n_gpu_layers=parse_ngl(n_gpu_layers), split=split)
    tokens = eng.tokenizer.tokenize(prompt, add_bos=not no_bos, special=special)
    eng.check_prompt(tokens)
    click.echo(f"cooktop: {path}: {eng.placement.summary()}", err=True)
    for note in eng.placement.notes:
        click.echo(f"cooktop: {note}", err=True)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed)
    out = sys.stdout
    out.write(prompt)
    out.flush()
    for piece in eng.generate(tokens, n_predict, params):
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    res = eng.result
    click.echo("", err=True)
    click.echo(f"cooktop: finish reason: {res.finish_reason}; seed {res.seed}", err=True)
    for line in res.timings.lines():
        click.echo(line, err=True)
