"""Reaching a Ray cluster: importing Ray, connecting, and turning Ray's failures into clear errors.

Ray is an optional extra (``pip install 'cooktop[ray]'``); nothing in cooktop imports
it unless a cluster is asked for (``--ray ADDRESS``, ``COOKTOP_RAY``,
``Llama(ray_address=...)``). Every wait on a remote call is bounded
(``COOKTOP_RAY_TIMEOUT`` seconds, default 300), and every Ray failure becomes a
:class:`~cooktop.errors.ClusterError` (or the ``CooktopError`` a node raised) that
says which node and segment failed and what to do, never a traceback or a hang.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from ..errors import ClusterError, CooktopError

#: How to make ``--ray`` work, shown when Ray does not import.
INSTALL_HINT = ("pip install 'cooktop[ray]' (Ray with Ray Serve) on this machine and on every node "
                "of the cluster")
ENV_ADDRESS = "COOKTOP_RAY"
ENV_TIMEOUT = "COOKTOP_RAY_TIMEOUT"


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ClusterError: Ray is not installed (the message says how to install it).
    """
    try:
        import ray
    except ImportError as e:
        raise ClusterError(f"--ray needs Ray, which does not import here ({e}); {INSTALL_HINT}") from None
    return ray


def address_from(explicit: str | None) -> str | None:
    """The cluster address asked for: ``explicit`` (``--ray``), else ``COOKTOP_RAY``, else None."""
    value = explicit if explicit is not None else os.environ.get(ENV_ADDRESS)
    return value.strip() if value and value.strip() else None


def call_timeout() -> float:
    """Seconds one remote call may take before it counts as hung (``COOKTOP_RAY_TIMEOUT``, default 300).

    Raises:
        ClusterError: the variable is not a positive number.
    """
    raw = os.environ.get(ENV_TIMEOUT, "300")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ClusterError(f"{ENV_TIMEOUT} must be a positive number of seconds, got {raw!r}")
    return value


def _check_reachable(address: str) -> None:
    """Refuse at once an address whose port nobody listens on (``ray.init`` would wait for minutes)."""
    if address == "auto" or "://" in address and not address.startswith("ray://"):
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"bad Ray address {address!r}: expected HOST:PORT (the head node's GCS, "
                           "default port 6379), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}; start one with "
                           "`ray start --head` there, or check --ray / COOKTOP_RAY") from None


def connect(address: str | None) -> Any:
    """Connect this process to the Ray cluster at ``address`` (once) and return ``ray``.

    Inside a Ray worker (a Serve replica, an actor) the process is connected
    already and ``address`` is not used.

    Args:
        address: ``HOST:PORT`` of the head node, ``ray://HOST:PORT``, or ``auto``.
    Raises:
        ClusterError: Ray is missing, no address was given, or the cluster cannot be reached.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if not address:
        raise ClusterError(f"no Ray cluster address: give --ray ADDRESS (HOST:PORT of the head node, or auto) "
                           f"or set {ENV_ADDRESS}")
    _check_reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError from ray.init
        raise ClusterError(f"cannot connect to the Ray cluster at {address}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from None
    return ray


def translate(err: BaseException, where: str) -> CooktopError:
    """A user-facing error for a failure of a remote call on ``where`` (e.g. ``node beta, blocks 4-7``).

    A ``CooktopError`` raised on the node keeps its type and gains ``where``;
    an actor or node that died, a lost object or a timeout becomes a
    :class:`ClusterError` saying so.
    """
    ray = import_ray()
    exc = ray.exceptions
    if isinstance(err, exc.RayTaskError):
        cause = getattr(err, "cause", None)
        if isinstance(cause, CooktopError):
            try:
                return type(cause)(f"{where}: {cause}")
            except Exception:  # noqa: BLE001 - a subclass with another constructor
                return ClusterError(f"{where}: {cause}")
        first = str(cause if cause is not None else err).strip().splitlines()
        return ClusterError(f"{where} failed: {type(cause).__name__ if cause is not None else 'error'}: "
                            f"{first[-1] if first else ''} (a bug in cooktop, or a broken node)")
    if isinstance(err, exc.GetTimeoutError):
        return ClusterError(f"{where} did not answer within {call_timeout():g} s ({ENV_TIMEOUT}); the node "
                            "may be hung or unreachable; this model's KV caches are lost: load it again")
    dead = tuple(getattr(exc, n) for n in ("RayActorError", "ObjectLostError", "OwnerDiedError", "NodeDiedError")
                 if hasattr(exc, n))
    if isinstance(err, dead):
        return ClusterError(f"{where} died ({type(err).__name__}: the node left the cluster or the process "
                            "was killed); this model's KV caches are lost: load the model again (a Ray Serve "
                            "replica is restarted by Ray)")
    return ClusterError(f"{where} failed: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}")


def get(refs: Any, where: str | Any, timeout: float | None = None) -> Any:
    """``ray.get(refs)`` bounded by ``timeout`` (default :func:`call_timeout`), errors translated.

    Args:
        where: a label for messages, or a callable ``(error) -> label`` (to name the failed node).
    Raises:
        ClusterError / the CooktopError raised remotely (see :func:`translate`).
    """
    ray = import_ray()
    try:
        return ray.get(refs, timeout=call_timeout() if timeout is None else timeout)
    except ray.exceptions.RayError as e:
        label = where(e) if callable(where) else where
        raise translate(e, label) from None
