"""Numerical quality of a model on a device: perplexity (``perplexity.py``), the reference
log-probabilities file (``logits_file.py``), the KL divergence from it (``kld.py``), and the
device x weight type table (``table.py``), as llama.cpp's tools/perplexity computes them.
"""
