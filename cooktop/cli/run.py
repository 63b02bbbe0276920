"""``cooktop run``: stream a continuation to stdout, llama.cpp-style timings to stderr."""

from __future__ import annotations

import functools
import os
import sys

import click

from ..cluster import is_cluster_selector
from ..engine import generate as _engine
from ..errors import CooktopError
from ..tools import hub
from .chat import chat_loop, chat_options, open_chat_model
from .common import (
    KVConfig,
    device_options,
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
from .sampling_options import chat_generation, generation_options, run_sampler, stop_criterion
from .spec_options import speculative_options

#: Single-character escapes of llama.cpp's ``string_process_escapes`` (common/common.cpp).
_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
_HEX = frozenset(b"0123456789abcdefABCDEF")


def process_escapes(text: str) -> str:
    """Expand backslash escapes in ``text`` like llama.cpp's ``string_process_escapes``
    (common/common.cpp), working on the UTF-8 bytes of ``text``.

    ``\\n \\r \\t \\' \\" \\\\`` become the character; ``\\xNN`` (exactly two hex
    digits) becomes the byte 0xNN; any other escape (``\\u4e2d``, ``\\q``), an
    incomplete ``\\x`` and a trailing lone backslash are kept literally. (llama.cpp
    parses ``NN`` with ``strtol``, which would also take `` f`` or ``-1``; cooktop
    accepts hex digits only.) Non-ASCII text passes through unchanged. Text that
    came from undecodable command-line bytes (surrogateescape) gets those bytes back.

    Returns:
        The expanded text, decoded as strict UTF-8.
    Raises:
        CooktopError: the bytes after expansion are not valid UTF-8 (e.g. a lone
            ``\\xff``): cooktop refuses rather than silently replacing them.
    """
    try:
        src = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:
        raise CooktopError(f"the prompt has an unpaired surrogate at character {err.start}; "
                           f"it is not valid text") from None
    out = bytearray()
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c != 0x5C or i + 1 >= n:  # not a backslash, or a trailing one: literal
            out.append(c)
            i += 1
            continue
        e = src[i + 1]
        if e in _ESCAPES:
            out += _ESCAPES[e]
            i += 2
        elif e == ord("x") and i + 3 < n and src[i + 2] in _HEX and src[i + 3] in _HEX:
            out.append(int(src[i + 2:i + 4], 16))
            i += 4
        else:  # unknown or incomplete escape: keep backslash and character
            out += src[i:i + 2]
            i += 2
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CooktopError(f"the prompt after -e escape processing is not valid UTF-8 at byte {err.start} "
                           f"(0x{out[err.start]:02x}); \\xNN escapes must spell whole UTF-8 characters") from None


@cli.command("run")
@llama_options("run")
@model_options
@click.option("-p", "--prompt", default="", help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.File("r"), default=None, help="Read the prompt from a file.")
@click.option("-n", "--n-predict", "n_predict", default=128, show_default=True,
              help="Tokens to generate (-1 = until the context is full).")
@click.option("-c", "--ctx-size", "n_ctx", default=0, show_default=True,
              help="Context size in tokens (0 = from the model, at most 4096).")
@click.option("-b", "--batch-size", "n_batch", default=512, show_default=True, help="Prompt tokens per forward pass.")
@generation_options
@click.option("-s", "--seed", default=-1, show_default=True, help="RNG seed (-1 = random).")
@click.option("--display-prompt/--no-display-prompt", "display_prompt", default=True, show_default=True,
              help="Echo the prompt before the generated text.")
@click.option("--verbose-prompt", is_flag=True, help="Print the prompt's tokens to stderr before generating.")
@click.option("--context-shift/--no-context-shift", "context_shift", default=False, show_default=True,
              help="When the context is full, drop the older half of it (after --keep tokens) and go on.")
@click.option("--keep", "n_keep", default=0, show_default=True,
              help="With --context-shift: prompt tokens always kept (-1 = the whole prompt).")
@click.option("-e", "--escape/--no-escape", "escape", default=True, show_default=True,
              help="Process escapes (\\n \\r \\t \\' \\\" \\\\ \\xNN) in -p, as llama.cpp does by default.")
@click.option("--no-bos", is_flag=True, help="Do not prepend the BOS token.")
@click.option("--special", is_flag=True, hidden=True,
              help="(Kept for compatibility: special tokens in the prompt are always parsed, as in llama-cli.)")
@click.option("-cnv", "--conversation", "conversation", flag_value=True, default=None,
              help="Conversation mode through the chat template (same as cooktop chat).")
@click.option("-no-cnv", "--no-conversation", "conversation", flag_value=False,
              help="Plain completion (the default).")
@click.option("--mmproj", "mmproj", default=None, type=click.Path(dir_okay=False),
              help="The model's vision projector (an mmproj GGUF), for --image. With -hf and --image: the "
                   "repo's mmproj*.gguf unless given.")
@click.option("--no-mmproj", "no_mmproj", is_flag=True,
              help="With -hf: do not fetch the repo's vision projector.")
@click.option("--image", "image", multiple=True, type=click.Path(dir_okay=False),
              help="An image (PNG, JPEG, WebP) for the prompt's <__media__> marker (repeat; no marker: in front).")
@chat_options
@speculative_options
@threads_option
@kv_options
@lora_options
@device_options
@ray_option
def run_cmd(model, hf_repo, hf_file, prompt, prompt_file, n_predict, n_ctx, n_batch, seed, display_prompt,
            verbose_prompt, context_shift, n_keep, escape, no_bos, special, conversation, mmproj, no_mmproj, image,
            single_turn,
            system,
            chat_template, chat_template_file, threads, threads_batch, device, n_gpu_layers, split, ray_address,
            tensors, speculative, kv, lora, **gen_opts):
    """Generate text from a prompt (like llama.cpp's llama-cli / llama-simple).

    Special tokens in the prompt (``<s>``, ``<|im_start|>``) are parsed, escapes
    are processed (``--no-escape`` to keep them), and ``-f`` drops one trailing
    newline of the file, as llama-cli does. ``-cnv`` (or ``-sys``) starts a
    conversation instead (see ``cooktop chat``). Every other llama-cli option is
    accepted; those cooktop does not act on say so in one line. ``-md DRAFT.gguf``,
    ``--spec-type ngram-simple`` or ``--spec-type draft-mtp`` (the file's own multi-token-prediction
    block) decode speculatively (the same text, fewer forward passes); the timings then end
    with the drafted / accepted counts, as llama-speculative-simple's.
    """
    if n_predict < -1:
        raise CooktopError(f"-n must be >= -1 (-1 = until the context is full), got {n_predict}")
    if n_keep < -1:
        raise CooktopError(f"--keep must be >= -1 (-1 = the whole prompt), got {n_keep}")
    path = resolve_model(model, hf_repo, hf_file)
    if prompt_file is not None:
        prompt = read_prompt_file(prompt_file)
    if escape:
        prompt = process_escapes(prompt)
    speculative.check()  # the draft options, before any model loads
    if notice := speculative.notice():
        click.echo(f"cooktop: {notice}", err=True)
    if image and not mmproj and hf_repo and not no_mmproj:  # llama.cpp's -hf fetches the repo's projector too
        repo = hub.parse_hf_spec(hf_repo, hf_file)[0]
        mmproj = hub.download_mmproj(repo, os.path.basename(path))
        if mmproj is None:
            raise CooktopError(f"--image needs --mmproj FILE: {repo} has no mmproj*.gguf (the vision projector)")
        click.echo(f"cooktop: vision projector {os.path.basename(mmproj)} from {repo}", err=True)
    if image and not mmproj:
        raise CooktopError("--image needs --mmproj FILE (the model's vision projector, mmproj-*.gguf)")
    if mmproj and (conversation or (conversation is None and system is not None)):
        raise CooktopError("--mmproj / --image: conversation mode with images is not supported yet; use -no-cnv")
    if mmproj and (ray_address or is_cluster_selector(device)):
        raise CooktopError("--mmproj / --image are not supported on a Ray cluster yet")
    if conversation or (conversation is None and system is not None):
        llm = open_chat_model(path, n_ctx, n_batch, device, n_gpu_layers, split, seed, threads, threads_batch,
                              chat_template, chat_template_file, ray_address, tensors, kv, lora)
        llm.draft_model, _draft = speculative.build(llm._engine, device, parse_ngl(n_gpu_layers))
        sys.exit(chat_loop(llm, chat_generation(llm, n_predict, gen_opts), system, prompt or None,
                           single_turn=single_turn))
    vision = None
    if mmproj:  # the mmproj and the images first: a bad file fails before the model loads
        from ..vision.session import load_inputs

        vision = load_inputs(mmproj, list(image))
    from ..api.options import set_threads
    set_threads(threads_batch or threads)
    load = _engine.load
    if ray_address or is_cluster_selector(device):
        from ..cluster.load import load as cluster_load

        load = functools.partial(cluster_load, ray_address=ray_address)
    extra = {"tensors": tensors} if moe_kwargs(tensors) else {}
    if load is _engine.load:
        extra["kv"] = kv
        if lora:
            extra["lora"] = lora
    elif lora:
        raise CooktopError("--lora: LoRA adapters are not supported on a Ray cluster yet")
    elif (kv.type_k, kv.type_v) != (KVConfig().type_k, KVConfig().type_v):
        raise CooktopError(f"-ctk/-ctv ({kv.label()}) are not supported on a Ray cluster yet")
    eng = load(path, n_ctx=n_ctx, n_batch=n_batch, device=device, n_gpu_layers=parse_ngl(n_gpu_layers), split=split,
               **extra)
    try:
        if mmproj:
            from ..vision.session import prefill

            assert vision is not None
            pre = prefill(eng, vision[0], vision[1], prompt, add_bos=not no_bos)
            tokens = pre.tokens
            for line in pre.lines():
                click.echo(line, err=True)
        else:
            tokens = eng.tokenizer.tokenize(prompt, add_bos=not no_bos, special=True)
        eng.check_prompt(tokens)
    except BaseException:
        eng.close()
        raise
    try:
        spec, draft_engine = speculative.build(eng, device, parse_ngl(n_gpu_layers))
    except BaseException:
        eng.close()
        raise
    click.echo(f"cooktop: {path}: {eng.placement.summary()}", err=True)
    for note in eng.placement.notes:
        click.echo(f"cooktop: {note}", err=True)
    if verbose_prompt:
        click.echo(f"cooktop: prompt: {prompt!r}\ncooktop: number of tokens in prompt = {len(tokens)}", err=True)
        for t in tokens:
            piece = ("<image>" if t < 0 else
                     eng.tokenizer.token_to_piece(t, special=True).decode("utf-8", "replace"))
            click.echo(f"cooktop: {t:6d} -> {piece!r}", err=True)
    sampler = run_sampler(eng.tokenizer, seed, gen_opts)
    out = sys.stdout
    if display_prompt:
        out.write(prompt)
        out.flush()
    criteria = stop_criterion(eng.tokenizer, len(tokens), gen_opts["reverse_prompt"])
    gen = eng.generate(tokens, n_predict, sampler, stopping_criteria=criteria,
                       n_keep=n_keep if context_shift else None, draft=spec)
    for step in gen:
        out.write(step.text)
        out.flush()
    out.write("\n")
    out.flush()
    res = gen.result
    click.echo("", err=True)
    click.echo(f"cooktop: finish reason: {res.finish_reason}; seed {res.seed}", err=True)
    for line in res.timings.lines():
        click.echo(line, err=True)
    hop_stats = getattr(eng.model, "stats", None)
    if hop_stats is not None and hop_stats.n_tokens:
        st = hop_stats.summary()
        click.echo(f"cooktop: ray: {st['ms_per_token']:.2f} ms per decoded token = compute "
                   f"{' + '.join(f'{c:.2f}' for c in st['compute_ms'])} ms (per segment) + overhead "
                   f"{st['overhead_ms']:.2f} ms ({st['overhead_ms_per_hop']:.2f} ms per hop, {st['n_hops']} hops)",
                   err=True)
    if draft_engine is not None:
        draft_engine.close()
    eng.close()
