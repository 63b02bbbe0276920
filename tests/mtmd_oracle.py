"""llama.cpp's libmtmd as the oracle of the vision tests (llama-cpp-python's ``llama_cpp.mtmd_cpp`` ctypes).

:func:`reference` loads a text model and its mmproj once, tokenizes a prompt with its images
(``mtmd_tokenize``: text chunks with the projector's markers, ``<start_of_image>`` /
``<end_of_image>`` for Gemma 3, and one chunk per image), encodes each image chunk
(``mtmd_encode_chunk``, ``mtmd_get_output_embd``) and evaluates the whole prompt
(``mtmd_helper_eval_chunks``: text batches causal, image batches non-causal where
``mtmd_decode_use_non_causal`` says so), returning the last position's logits
(``llama_get_logits_ith(ctx, -1)``). Images are given as RGB arrays (``mtmd_bitmap_init``) so both
sides see the same pixels, whatever the decoder.
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np


@dataclasses.dataclass
class MtmdResult:
    """What llama.cpp computed for one prompt.

    Attributes:
        chunks: per chunk, ``("text", [ids])`` or ``("image", float32 [n_tokens, n_embd])``.
        logits: float32 [n_vocab] after the last prompt token.
        n_past: positions the prompt took.
        non_causal: ``mtmd_decode_use_non_causal`` for the image chunks.
    """

    chunks: list[tuple[str, object]]
    logits: np.ndarray
    n_past: int
    non_causal: bool


_QUIET: list = []  # the no-op log callback, kept alive while llama.cpp may call it


def reference(model_path: str, mmproj_path: str, prompt: str, images: list[np.ndarray], n_ctx: int = 256,
              n_batch: int = 64, flash_attn: int = 0) -> MtmdResult:
    """Run llama.cpp's mtmd on ``prompt`` (with ``<__media__>`` markers) and ``images`` (uint8 [h, w, 3]).

    ``flash_attn``: the encoder's ``mtmd_context_params.flash_attn_type`` (llama.h
    ``llama_flash_attn_type``: -1 auto, 0 disabled, 1 enabled). Default 0: the float32 path
    (``mul_mat`` + ``soft_max_ext``); enabled, clip.cpp casts K and V to F16 first.

    Raises:
        ImportError: llama-cpp-python without libmtmd.
        RuntimeError: a load, tokenize, encode or eval step failed.
    """
    import llama_cpp
    import llama_cpp.mtmd_cpp as M

    if not _QUIET:
        _QUIET.append(llama_cpp.llama_log_callback(lambda level, text, user_data: None))
    llama_cpp.llama_log_set(_QUIET[0], None)
    M.mtmd_log_set(_QUIET[0], None)
    M.mtmd_helper_log_set(_QUIET[0], None)
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {model_path}")
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = n_ctx, n_batch, n_batch, 2, 2
    ctx = llama_cpp.llama_init_from_model(model, cp)
    mparams = M.mtmd_context_params_default()
    mparams.use_gpu, mparams.print_timings, mparams.n_threads, mparams.warmup = False, False, 2, False
    mparams.flash_attn_type = flash_attn
    mctx = M.mtmd_init_from_file(mmproj_path.encode(), model, mparams)
    if not mctx:
        raise RuntimeError(f"mtmd could not load {mmproj_path}")
    bitmaps = []
    chunks = M.mtmd_input_chunks_init()
    try:
        for img in images:
            img = np.ascontiguousarray(img, dtype=np.uint8)
            h, w = img.shape[:2]
            bmp = M.mtmd_bitmap_init(w, h, img.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
            bitmaps.append(bmp)
        text = M.mtmd_input_text()
        raw = prompt.encode()
        text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), True, True
        arr = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        if M.mtmd_tokenize(mctx, chunks, ctypes.byref(text), arr, len(bitmaps)) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        n_embd = llama_cpp.llama_model_n_embd(model)
        out: list[tuple[str, object]] = []
        non_causal = False
        for i in range(M.mtmd_input_chunks_size(chunks)):
            ch = M.mtmd_input_chunks_get(chunks, i)
            if M.mtmd_input_chunk_get_type(ch) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                if M.mtmd_encode_chunk(mctx, ch) != 0:
                    raise RuntimeError("mtmd_encode_chunk failed")
                n = M.mtmd_input_chunk_get_n_tokens(ch)
                ptr = M.mtmd_get_output_embd(mctx)
                out.append(("image", np.ctypeslib.as_array(ptr, shape=(n * n_embd,)).reshape(n, n_embd).copy()))
                non_causal = bool(M.mtmd_decode_use_non_causal(mctx, ch))
            else:
                nt = ctypes.c_size_t()
                ids = M.mtmd_input_chunk_get_tokens_text(ch, ctypes.byref(nt))
                out.append(("text", [int(ids[j]) for j in range(nt.value)]))
        new_n_past = llama_cpp.llama_pos(0)
        if M.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, n_batch, True, ctypes.byref(new_n_past)) != 0:
            raise RuntimeError("mtmd_helper_eval_chunks failed")
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        return MtmdResult(out, logits.astype(np.float32), int(new_n_past.value), non_causal)
    finally:
        M.mtmd_input_chunks_free(chunks)
        for b in bitmaps:
            M.mtmd_bitmap_free(b)
        M.mtmd_free(mctx)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
