"""``cooktop quantize``: llama-quantize's file types, per-tensor mixtures and reference quantizers in numpy.

Modules: :mod:`.search` and :mod:`.kquants` (ggml-quants.c's K-quant reference quantizers, bit for bit),
:mod:`.rows` (every writable type), :mod:`.ftypes` (llama-quantize's type names), :mod:`.mixture`
(llama.cpp's per-tensor type choice), :mod:`.model` (reads a GGUF, writes the quantized GGUF).
"""
