"""The engine: generation (``generate``) with sampling beside it (``sampling``)."""
