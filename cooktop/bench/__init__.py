"""``cooktop bench``: llama-bench-style throughput measurements, an op-level roofline, plots.

Modules, one concept each:

- :mod:`.machine`: what the measurements ran on (CPU, OS, package and driver versions).
- :mod:`.runner`: pp / tg / pg measurements over a sweep of models, devices, ``-ngl``, ``-b``.
- :mod:`.vs_llamacpp`: the same tests through llama-cpp-python, interleaved (``--vs llama.cpp``).
- :mod:`.ops`: copy bandwidth, matmul and rmsnorm at model shapes (``--ops``, the roofline view).
- :mod:`.report`: md / csv / json / jsonl output and the ``--plot`` bar chart.
"""
