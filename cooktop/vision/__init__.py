"""Images in, text out: mmproj files (``mmproj.py``), image preprocessing (``preprocess.py``), the
vision encoder on the device op table (``encoder.py``), prompts with images (``prompt.py``) and
their evaluation on a loaded model (``session.py``). See docs/DESIGN.md, "Vision"."""
