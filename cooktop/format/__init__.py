"""The file formats: GGUF files (``gguf``) and GGML weight block layouts (``quants``)."""
