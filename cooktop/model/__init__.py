"""The model: its config from GGUF metadata and the forward pass."""
