"""Per-device autotuning of kernel launch parameters (``cooktop tune``).

- :mod:`.space`: the declared search space per backend flavour and kernel family, and how a
  choice maps onto each backend's launch parameters;
- :mod:`.tuner`: timing and checking the candidates on an open device at a model's shapes;
- :mod:`.cache`: the chosen parameters per device identity and driver version, which a device
  opens with (``COOKTOP_NO_TUNE=1`` / ``cooktop --no-tune``: today's defaults).
"""
