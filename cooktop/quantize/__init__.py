"""``cooktop quantize``: llama-quantize's file types, per-tensor mixtures and quantizers in numpy.

Modules: :mod:`.search`, :mod:`.kquants`, :mod:`.iq4` and :mod:`.iquants` (ggml-quants.c's quantizers and
their importance-matrix variants, bit for bit), :mod:`.rows` (every writable type), :mod:`.ftypes`
(llama-quantize's type names), :mod:`.mixture` (llama.cpp's per-tensor type choice), :mod:`.imatrix`
(llama-imatrix files), :mod:`.model` (reads a GGUF, writes the quantized GGUF).
"""
