"""llama-cpp-python's ``llama_cpp.llama_speculative`` under cooktop: draft models for ``Llama(draft_model=...)``.

    from cooktop import Llama
    from cooktop.api.llama_speculative import LlamaPromptLookupDecoding
    llm = Llama(model_path="model.gguf", draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

``LlamaDraftModel`` is the interface (``__call__(input_ids int [n]) -> int [m]``);
``LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)`` drafts by prompt lookup;
``LlamaMTPDecoding(num_pred_tokens=3, p_min=0.0)`` (cooktop's) with the file's own multi-token-prediction
block (Qwen3.5 / Qwen3.6 files with ``nextn_predict_layers`` = 1; llama.cpp ``--spec-type draft-mtp``).
Drafts are verified in one forward of the model and the answers are those without a draft
model (see :mod:`cooktop.engine.speculative`).
"""

from __future__ import annotations

from ..engine.speculative import LlamaDraftModel, LlamaMTPDecoding, LlamaPromptLookupDecoding

__all__ = ["LlamaDraftModel", "LlamaMTPDecoding", "LlamaPromptLookupDecoding"]
