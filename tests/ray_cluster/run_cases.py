"""Run the cluster case modules once, in a network namespace of their own, in the background of a test run.

``tests/conftest.py`` starts this script (:func:`start`) as soon as a run's collection holds
``tests/test_cluster.py::test_cluster_cases``, so the local Ray cluster's five minutes, most of
them waiting on Ray, overlap the whole suite instead of holding one pytest-xdist worker (and the
tests queued behind it on that worker); the cases are collected last and read the results
(:func:`results`). One run per test run: the first process to take the run folder's lock starts
it, and the child holds that lock until the results are written, so a reader that takes the lock
finds them.

Run as a script: ``python run_cases.py RESULTS.json JUNIT.xml`` writes
``{"results": {module: [[case, outcome], ...]}, "tail": output tail}``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

#: The case modules of this folder, each reported by one test of tests/test_cluster.py.
CASES = ["cases_quality", "cases_pipeline", "cases_serve"]
#: tests/ray_cluster -> the repository root
ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Seconds the cases may take in all (a 2-core machine under the whole suite: about 400).
TIMEOUT_S = 1500
RESULTS = "cooktop-cluster-results.json"
LOCK = "cooktop-cluster.lock"
STARTED = "cooktop-cluster-started"

_child: subprocess.Popen | None = None  # the background run this process started
_cases_pgid: int | None = None  # the session of the namespace's pytest (its Ray daemons included)


def run_cases(xml: pathlib.Path) -> tuple[dict[str, list[tuple[str, str]]], str]:
    """Run the case modules in a network namespace; (outcomes by module, the output's tail).
    Failing to run them at all gives ``{}`` and the reason as the tail."""
    files = [str(ROOT / "tests" / "ray_cluster" / f"{m}.py") for m in CASES]
    script = ('ip link set lo up && xml="$1" && shift && '
              'exec "$0" -m pytest -q -p no:cacheprovider -o python_files="cases_*.py" --junitxml="$xml" "$@"')
    env = {**os.environ, "COOKTOP_CLUSTER_NETNS": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), "COOKTOP_RAY": "", "RAY_USAGE_STATS_ENABLED": "0",
        # the cases share one cluster and count as test_cluster_cases' wait, not as tests of their own
        "COOKTOP_SLOW_LIMIT": "0"}
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        env.pop(var, None)  # the inner pytest is no xdist worker
    # a session of its own: on a timeout the whole tree goes, Ray's daemons included (they outlive
    # the driver otherwise)
    proc = subprocess.Popen(["unshare", "-n", "sh", "-c", script, sys.executable, str(xml), *files],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    global _cases_pgid
    _cases_pgid = proc.pid
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, _ = proc.communicate()
        return {}, f"the cluster cases did not finish in {TIMEOUT_S} s:\n{stdout[-3000:]}"
    if not xml.exists():
        return {}, f"the cluster cases did not run (exit {proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}"
    results: dict[str, list[tuple[str, str]]] = {m: [] for m in CASES}
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        outcome = "passed"
        if failure is not None:
            outcome = f"FAILED: {failure.get('message', '')}\n{(failure.text or '')[-2500:]}"
        elif skipped is not None:
            outcome = f"skipped: {skipped.get('message', '')}"
        results.setdefault(module, []).append((case.get("name"), outcome))
    return results, stdout[-3000:]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def missing() -> tuple[str, str] | None:
    """(resource, why) when the cases cannot run here (Ray, Ray Serve or fastapi, ``unshare`` / ``ip``,
    root for ``unshare -n``), else None."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("ray") is None:
        return "ray", "ray does not import; pip install 'cooktop[ray]'"
    if importlib.util.find_spec("ray.serve") is None or importlib.util.find_spec("fastapi") is None:
        return "ray", "ray.serve (or fastapi) is missing; pip install 'cooktop[ray,server]'"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return "ray", f"no `{tool}` (util-linux / iproute2) to give the cluster a loopback-only network"
    if os.geteuid() != 0:
        return "ray", "the cluster cases need root for `unshare -n` (a network namespace of their own)"
    return None


def start(run_dir: pathlib.Path) -> bool:
    """Start this script in the background for the test run whose shared folder is ``run_dir``,
    unless a process of the run did already (its lock is taken, or it left its mark).
    True when this call started it; the child holds the lock until it has written the results."""
    global _child
    with open(run_dir / LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # running, started by another worker
        if (run_dir / STARTED).exists():
            return False
        (run_dir / STARTED).write_text(str(os.getpid()))
        xml = run_dir / "cooktop-cluster-junit.xml"
        log = open(run_dir / "cooktop-cluster.log", "w")
        _child = subprocess.Popen([sys.executable, __file__, str(run_dir / RESULTS), str(xml)],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  pass_fds=(lock.fileno(),), start_new_session=True, cwd=ROOT)
        log.close()
    return True  # our descriptor is closed; the child's copy keeps the lock


def stop() -> None:
    """End a background run this process started that is still going (an interrupted test run)."""
    if _child is not None and _child.poll() is None:
        _child.terminate()  # its handler ends the cases' session, then it exits
        try:
            _child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(_child.pid)
            _child.wait()


def wait() -> None:
    """Wait for a background run this process started (at most :data:`TIMEOUT_S` + 60 s, then end it)."""
    if _child is not None and _child.poll() is None:
        try:
            _child.wait(timeout=TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            stop()


def results(run_dir: pathlib.Path) -> dict | None:
    """The background run's results once it has ended (waits for its lock), or None when no process
    of this test run started one."""
    if not (run_dir / STARTED).exists():
        return None
    with open(run_dir / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the child exits
        done = run_dir / RESULTS
        if not done.exists():
            return {"results": {}, "tail": f"the background run of the cluster cases left no results; its output:\n"
                    f"{_tail(run_dir / 'cooktop-cluster.log')}"}
        return json.loads(done.read_text())


def _tail(path: pathlib.Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError as e:
        return f"({path}: {e})"


def main(argv: list[str]) -> int:
    """Script entry: run the cases, write RESULTS.json (the inherited lock is released on exit)."""
    out, xml = pathlib.Path(argv[0]), pathlib.Path(argv[1])

    def on_term(_sig, _frame):
        if _cases_pgid is not None:
            _kill_group(_cases_pgid)
        sys.exit(1)

    signal.signal(signal.SIGTERM, on_term)
    res, tail = run_cases(xml)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"results": res, "tail": tail}))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
