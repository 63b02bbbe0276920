"""``cooktop report``: one page of what this machine's devices can do (capability, speed, numerical
quality), from a fixed, versioned suite (``suite.py``) run in-process (``runner.py``), written as
``report.json`` (``schema.py``) and a self-contained ``index.html`` (``page.py``); ``compare.py`` puts
several reports side by side."""
