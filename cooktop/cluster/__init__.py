"""Past one machine: cooktop on a Ray cluster (optional extra ``cooktop[ray]``).

- ``nodes``: the cluster's live nodes and their names, ``NODE/DEVICE`` selectors,
  work pinned to a node (device probes, file checks).
- ``pipeline``: :class:`ClusterModel`, a model whose placement segments run in
  Ray actors on their nodes (weights and KV cache there), activations passed
  between them as Ray calls; a ``model.placed.PlacedModel`` as the local model is.
- ``load``: the placement over the cluster's devices (by each node's probed
  memory) and :func:`load`, an ``Engine`` on a :class:`ClusterModel`.
- ``weights``: the node's own copy of the GGUF, or the segment's tensors shipped
  once through Ray's object store.
- ``report``: what ``cooktop devices --ray`` and ``cooktop plan --ray`` print
  (devices per node; per-token transfer bytes and measured hop latency).

Ray is imported only when a cluster is asked for (``connect.import_ray`` says how
to install it otherwise). Ray Serve replicas are in ``cooktop.server.replicas``.
"""

from .connect import ENV_ADDRESS, INSTALL_HINT, address_from, connect, import_ray
from .nodes import is_cluster_selector

__all__ = ["ENV_ADDRESS", "INSTALL_HINT", "address_from", "connect", "import_ray", "is_cluster_selector"]
