"""Tools that are not the product: synthetic models (``synth``), the Hugging Face Hub helper (``hub``)."""
