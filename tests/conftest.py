"""Shared fixtures: where the shared data lives, device fixtures, and COOKTOP_REQUIRE.

``COOKTOP_REQUIRE`` (comma list, e.g. ``shared,opencl,vulkan``) turns the skip
of a test that needs a missing resource into a failure, so a broken install
can never pass as green. ``.ci/run`` sets it. (``vulkan_validation``, the
Khronos validation layer, is required the same way by tests/vulkan_validation.py.)
Resources: ``shared``, device families, ``server``, ``openai``, ``anthropic`` (the client),
``browser`` (chromium + chromedriver + selenium, for the web page test), and more.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from cooktop.backends import registry

#: The slow-test guard (a call over 20 s needs @pytest.mark.slow(reason=...)).
pytest_plugins = ["slowguard"]

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("COOKTOP_SHARED", ROOT.parent / "shared"))

# Every replayed device graph issues its ops again and is checked against its recording
# (Device.graph), so a graph key that misses something fails a test, never answers wrongly.
os.environ.setdefault("COOKTOP_GRAPH_CHECK", "1")

# Devices open with today's default launch parameters, whatever `cooktop tune` cached on this
# machine (a tuned choice is only parity-bound where its family is not exact); tests/test_tune.py
# turns tuning on with a cache folder of its own.
os.environ.setdefault("COOKTOP_NO_TUNE", "1")


def pytest_configure(config):
    # `-k vulkan` selects the Vulkan tests (tests/vulkan_validation.py runs them under the
    # validation layer): test_vulkan*.py, ids with a vulkan parameter, and tests marked so
    config.addinivalue_line("markers", "vulkan: uses a Vulkan device without 'vulkan' in its test id")
    config.addinivalue_line("markers", "late: scheduled last (waits on work started in the background at "
                                       "collection: pytest_collection_finish)")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``late`` last, in their order: the Ray cluster's cases, whose run
    (tests/ray_cluster/run_cases.py) :func:`pytest_collection_finish` starts in the background, so
    that by the time a worker reaches them their five minutes, mostly waiting on Ray, have
    overlapped the rest of the suite instead of holding a pytest-xdist worker and the tests
    queued behind it (xdist's first batches are consecutive runs of the collection)."""
    late = [it for it in items if it.get_closest_marker("late") is not None]
    if late:
        items[:] = [it for it in items if it.get_closest_marker("late") is None] + late


def _run_dir(config) -> pathlib.Path:
    """The test run's temporary folder (under pytest-xdist: above each worker's own)."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def pytest_collection_finish(session):
    """Start the Ray cluster's cases in the background when this run will report them (once per
    run: the first worker gets the run folder's lock; tests/test_cluster.py ``cluster_run`` waits
    for the results, or runs the cases itself when nothing started them)."""
    if session.config.option.collectonly or not any(
            it.get_closest_marker("late") is not None and it.nodeid.startswith("tests/test_cluster.py::")
            for it in session.items):
        return
    from ray_cluster import run_cases
    if run_cases.missing() is None:
        run_cases.start(_run_dir(session.config))


def pytest_sessionfinish(session, exitstatus):
    """A background cluster run this process started and the run was interrupted: end it; else it
    is waited for (the worker that started it may finish its tests before another reads it)."""
    from ray_cluster import run_cases
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        run_cases.stop()
    else:
        run_cases.wait()


def required() -> set[str]:
    """Resources named in COOKTOP_REQUIRE."""
    return {s.strip().lower() for s in os.environ.get("COOKTOP_REQUIRE", "").split(",") if s.strip()}


def skip_or_fail(resource: str, why: str) -> None:
    """Skip with a message naming what is missing, or fail when COOKTOP_REQUIRE names ``resource``."""
    if resource in required():
        pytest.fail(f"required resource {resource!r} missing (COOKTOP_REQUIRE): {why}", pytrace=False)
    pytest.skip(f"{resource} missing: {why}")


@pytest.fixture(scope="session")
def shared() -> pathlib.Path:
    """The ``../shared`` folder (models, reference, vocab); skips when absent."""
    if not (SHARED / "models" / "stories260K.gguf").exists():
        skip_or_fail("shared", f"no shared data at {SHARED} (set COOKTOP_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def stories(shared) -> pathlib.Path:
    return shared / "models" / "stories260K.gguf"


def open_family_device(family: str):
    """Open the first usable device of ``family`` (a name of registry.FAMILIES) or skip/fail naming why."""
    res = registry.probe(family)
    if not res.available:
        skip_or_fail(family, f"{res.reason}; to enable: {res.hint}")
    sel = res.devices[0].selector
    return registry.open_device(sel)


@pytest.fixture(scope="session", params=list(registry.FAMILIES))
def any_device(request):
    """Each usable device family in turn (first device of each; registry.FAMILIES)."""
    return open_family_device(request.param)


@pytest.fixture(scope="session", params=registry.DEVICE_FAMILIES)
def gpu_device(request):
    """Each device backend (not numpy) in turn; parity tests compare it with numpy."""
    return open_family_device(request.param)


@pytest.fixture(scope="session")
def cpu_device():
    return registry.open_device("cpu")


def rewrite_gguf(src, dst, *, drop=(), arch=None, extra_kv=(), replace=None, add=None, drop_tensors=()):
    """Copy the GGUF ``src`` to ``dst`` with gguf's GGUFWriter, changing it on the way.

    Args:
        drop: metadata keys to leave out.
        arch: a new ``general.architecture``.
        extra_kv: (key, value, GGUFValueType) to add.
        replace: tensor name -> (data, raw GGML type or None) replacing that tensor.
        add: tensor name -> (data, raw GGML type or None) appended.
        drop_tensors: tensor names to leave out.
    Returns:
        ``dst``.
    """
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=arch or r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in drop or key in ("general.architecture", "general.alignment"):
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, value, vtype in extra_kv:
        w.add_key_value(key, value, vtype)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        data, raw = (replace or {}).get(t.name, (np.array(t.data), t.tensor_type))
        w.add_tensor(t.name, data, raw_dtype=raw)
    for name, (data, raw) in (add or {}).items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def require_modules(resource: str, *modules: str) -> None:
    """Skip (or fail, when COOKTOP_REQUIRE names ``resource``) unless every module imports."""
    import importlib
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            skip_or_fail(resource, f"python module {m} does not import ({e}); pip install -e '.[server,dev]'")


@pytest.fixture(scope="session")
def server_deps():
    """fastapi + uvicorn + httpx (the ``server`` resource)."""
    require_modules("server", "fastapi", "uvicorn", "httpx")


@pytest.fixture(scope="session")
def openai_client_dep(server_deps):
    """The official ``openai`` client (the ``openai`` resource)."""
    require_modules("openai", "openai")


def with_chat_template(src, dst, template: str, extra=()):
    """A copy of the GGUF ``src`` with ``tokenizer.chat_template`` set (plus ``extra`` (key, value, type))."""
    from gguf import GGUFValueType
    return rewrite_gguf(src, dst, drop=("tokenizer.chat_template",),
                        extra_kv=[("tokenizer.chat_template", template, GGUFValueType.STRING), *extra])
