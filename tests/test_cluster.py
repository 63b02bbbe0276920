"""cooktop on a Ray cluster (cooktop.cluster, cooktop serve --ray): errors without a cluster, the
partial GGUF a node gets, and the cluster cases of tests/ray_cluster/.

The cluster cases start a local multi-node Ray cluster, which must stay on
loopback: Ray binds the host's external address even when told 127.0.0.1, so
they run in a network namespace of their own with only loopback up
(``unshare -n``, then ``ip link set lo up``; needs root, as CI has), where it
binds 127.0.0.1. One pytest run inside the namespace holds every case and one
cluster (tests/ray_cluster/run_cases.py, started in the background when the run's
collection holds the cluster cases); each test here reports one case module from its JUnit XML.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SHARED, skip_or_fail
from ray_cluster import run_cases

CASES = run_cases.CASES


def run_cli(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "cooktop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def no_ray_env(tmp_path: pathlib.Path) -> dict:
    """An environment where ``import ray`` fails (a stand-in package first on PYTHONPATH)."""
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ray (test stand-in)')\n")
    path = os.pathsep.join([str(tmp_path / "noray"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "COOKTOP_RAY": ""}


# -- without a cluster --------------------------------------------------------------------------------

def test_ray_flag_without_ray_says_how_to_install(tmp_path):
    env = no_ray_env(tmp_path)
    for args in (["devices", "--ray", "127.0.0.1:6379"],
                 ["run", "-m", str(SHARED / "models" / "stories260K.gguf"), "--ray", "127.0.0.1:6379", "-n", "1"]):
        r = run_cli(*args, env=env)
        assert r.returncode == 1, r.stderr
        assert "--ray needs Ray, which does not import here" in r.stderr
        assert "pip install 'cooktop[ray]'" in r.stderr
        assert "Traceback" not in r.stderr


def require_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as e:
        skip_or_fail("ray", f"ray does not import ({e}); pip install 'cooktop[ray]'")


def test_node_selector_without_a_cluster_is_refused(monkeypatch, stories):
    from cooktop import Llama
    from cooktop.backends import registry
    from cooktop.errors import ClusterError, DeviceError

    with pytest.raises(DeviceError, match=r"names a node of a Ray cluster: give --ray ADDRESS"):
        registry.resolve("alpha/opencl:0")
    require_ray()
    monkeypatch.delenv("COOKTOP_RAY", raising=False)
    with pytest.raises(ClusterError, match=r"no Ray cluster address: give --ray ADDRESS"):
        Llama(model_path=str(stories), device="alpha/cpu,beta/cpu", verbose=False)
    r = run_cli("run", "-m", str(stories), "--device", "alpha/cpu", "-n", "1", env={"COOKTOP_RAY": ""})
    assert r.returncode == 1 and "no Ray cluster address" in r.stderr, r.stderr


def test_unreachable_cluster_fails_at_once():
    require_ray()
    r = run_cli("devices", "--ray", "127.0.0.1:1", timeout=60)
    assert r.returncode == 1
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in r.stderr and "ray start --head" in r.stderr
    r = run_cli("devices", "--ray", "nonsense")
    assert r.returncode == 1 and "bad Ray address 'nonsense'" in r.stderr


def test_replicas_need_ray(stories):
    r = run_cli("serve", "-m", str(stories), "--replicas", "2", env={"COOKTOP_RAY": ""})
    assert r.returncode == 1 and "--replicas needs --ray ADDRESS" in r.stderr, r.stderr


def test_partial_gguf_runs_a_segment_like_the_whole_file(tmp_path, stories):
    """What a node without the file gets: the tensors of its segment (and the metadata) as a GGUF;
    a Segment built from it computes what one built from the whole file does."""
    from cooktop.backends import registry
    from cooktop.cluster.weights import metadata_fields, tensor_names, write_partial
    from cooktop.format.gguf import open_gguf
    from cooktop.model.config import load_config
    from cooktop.model.forward import Rows, Segment

    gf = open_gguf(stories)
    cfg = load_config(gf)
    names = tensor_names(gf, cfg, [3, 4], True)
    assert names == [n for n in gf.tensors if n.startswith(("blk.3.", "blk.4.", "output"))]
    assert "token_embd.weight" not in names and "blk.2.attn_q.weight" not in names
    assert tensor_names(gf, cfg, [0], False) == [n for n in gf.tensors if n.startswith("blk.0.")]
    path = write_partial(str(tmp_path / "part.gguf"), gf.architecture, metadata_fields(gf),
                         [(n, gf.tensor(n).data, gf.tensor(n).ggml_type) for n in names])
    part = open_gguf(path)
    assert list(part.tensors) == names and part.metadata["llama.block_count"] == 5
    dev = registry.open_device("cpu")
    x = np.random.default_rng(0).standard_normal((3, cfg.n_embd)).astype(np.float32)
    pos = np.arange(3, dtype=np.int32)
    outs = []
    for g in (gf, part):
        seg = Segment(dev, [3, 4], True, g, cfg, 8, True)
        kv = [[dev.zeros((16, cfg.n_embd_kv)) for _ in range(2)] for _ in range(2)]
        outs.append(seg.run(x, Rows(pos), kv[0], kv[1]))
        seg.release()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_shipped_weights_never_land_outside_the_cache(tmp_path, monkeypatch):
    from cooktop.cluster.weights import cache_dir, materialize
    from cooktop.errors import ClusterError

    monkeypatch.setenv("COOKTOP_RAY_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == str(tmp_path / "cache")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF original")
    with pytest.raises(ClusterError, match="refusing to write shipped weights outside"):
        materialize(None, str(model))
    assert model.read_bytes() == b"GGUF original"


# -- the cluster cases, in a network namespace -------------------------------------------------------

@pytest.fixture(scope="session")
def cluster_run(shared, tmp_path_factory):
    """The outcomes of every case module, run once per test run inside ``unshare -n`` with loopback up.

    ``tests/conftest.py`` starts them in the background when the collection holds these tests
    (tests/ray_cluster/run_cases.py), so they overlap the suite; here the tests, collected last,
    wait for that run's results. Without it (the hook did not start one), the first process of the
    run to get here runs them (under the run folder's lock) and leaves the results for the others."""
    require_ray()
    why = run_cases.missing()
    if why is not None:
        skip_or_fail(*why)
    run_dir = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_dir = run_dir.parent  # the run's folder, above each worker's own
    saved = run_cases.results(run_dir)
    if saved is None:
        done = run_dir / run_cases.RESULTS
        with open(run_dir / run_cases.LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                results, tail = run_cases.run_cases(tmp_path_factory.mktemp("cluster") / "junit.xml")
                done.write_text(json.dumps({"results": results, "tail": tail}))
        saved = json.loads(done.read_text())
    return {m: [tuple(c) for c in cases] for m, cases in saved["results"].items()}, saved["tail"]


@pytest.mark.timeout(1600)
@pytest.mark.late
@pytest.mark.parametrize("module", CASES)
def test_cluster_cases(cluster_run, module):
    """Every case of tests/ray_cluster/<module>.py passed (skips count as failures under COOKTOP_REQUIRE)."""
    results, tail = cluster_run
    cases = results.get(module, [])
    assert cases, f"no case of {module} ran:\n{tail}"
    bad = [f"{name}: {outcome}" for name, outcome in cases if outcome != "passed"]
    if bad and all(o.startswith("skipped") for _n, o in cases if o != "passed"):
        skip_or_fail("ray", "; ".join(bad))
    assert not bad, "\n\n".join(bad)
