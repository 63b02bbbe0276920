"""Fixtures of the cluster cases: one local Ray cluster on loopback, shared by every case.

These cases run only through ``tests/test_cluster.py``, which starts pytest on
them inside a network namespace of its own with only loopback up (``unshare -n``),
where Ray binds 127.0.0.1: no cluster traffic can leave the machine. The nodes
(``ray.cluster_utils.Cluster``, one CPU slot each): ``alpha`` (the head: every
backend) and ``beta`` (numpy only: ``COOKTOP_DISABLE=opencl,vulkan`` in its
environment, so the two nodes differ as a lab's machines do).
"""

from __future__ import annotations

import os
import sys

import pytest

#: Set by tests/test_cluster.py inside the namespace.
NETNS_ENV = "COOKTOP_CLUSTER_NETNS"


def agent_ports() -> dict[str, int]:
    """Fixed ports for a node's agents: with port 0 the raylet waits (30 s at most) for each agent
    to write its port to a file, which a busy 2-core machine can miss (nobody else listens in the
    namespace, so a port free now stays free)."""
    import socket

    out = {}
    for key in ("metrics_agent_port", "dashboard_agent_listen_port", "runtime_env_agent_port", "metrics_export_port"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            out[key] = s.getsockname()[1]
    return out


def start_cluster():
    """alpha (head) and beta; one retry, since Ray's start-up has fixed timeouts a loaded machine can miss."""
    from ray.cluster_utils import Cluster

    for attempt in (1, 2):
        cluster = Cluster()
        try:
            cluster.add_node(num_cpus=1, node_name="alpha", node_ip_address="127.0.0.1", include_dashboard=False,
                             **agent_ports())
            cluster.add_node(num_cpus=1, node_name="beta", node_ip_address="127.0.0.2",
                             env_vars={"COOKTOP_DISABLE": "opencl,vulkan"}, **agent_ports())
            return cluster
        except Exception:
            cluster.shutdown()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """The running cluster (``.address``: its GCS on 127.0.0.1); this process is its driver."""
    if os.environ.get(NETNS_ENV) != "1":
        pytest.fail("the cluster cases run through tests/test_cluster.py (in a network namespace of their own)")
    import ray

    # the nodes inherit this environment: shipped weights go to a folder of this run
    os.environ["COOKTOP_RAY_CACHE"] = str(tmp_path_factory.mktemp("ray-cache"))
    cluster = start_cluster()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        addrs = {n["NodeManagerAddress"] for n in ray.nodes()}
        assert addrs == {"127.0.0.1", "127.0.0.2"}, f"the cluster must stay on loopback, its nodes bind {addrs}"
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def address(ray_cluster) -> str:
    """``HOST:PORT`` of the cluster (what ``--ray`` takes)."""
    return ray_cluster.address


def cli(*args: str, timeout: float = 300, env: dict | None = None):
    """``python -m cooktop.cli ARGS`` (a separate driver process), completed."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
