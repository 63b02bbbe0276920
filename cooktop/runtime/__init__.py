"""The runtime: placement of a model on devices, memory budget, loading."""
