"""The slow-test guard: a test whose call takes more than :data:`LIMIT_S` seconds without a
``@pytest.mark.slow(reason="why it cannot be cheaper")`` marker is listed at the end of the run
("unmarked slow tests"); with ``COOKTOP_SLOW_STRICT=1`` it fails instead. The default only reports,
because a duration depends on the machine (the suite's outcome must not: the VMs differ and are
shared; speed is the benchmarks' business); run strict on a quiet machine to find the tests to cut.

Loaded by ``tests/conftest.py`` (``pytest_plugins``). ``COOKTOP_SLOW_LIMIT`` (seconds) overrides the
limit (``0`` turns the guard off, e.g. under the validation harnesses, where every test runs many
times slower). Only the call phase counts: a session fixture's one-time cost (a model load, a kernel
build) is the fixture's, shared by every test that uses it. A ``slow`` marker without a reason is
an error at collection. README "Tests" lists the marked tests.
"""

from __future__ import annotations

import os

import pytest

#: Seconds a test's call may take without a ``slow`` marker (a 2-core machine, the whole suite).
LIMIT_S = 20.0


def limit() -> float:
    """The limit in seconds (``COOKTOP_SLOW_LIMIT``, else :data:`LIMIT_S`); 0: no guard.

    Raises:
        pytest.UsageError: ``COOKTOP_SLOW_LIMIT`` is not a number of seconds >= 0.
    """
    raw = os.environ.get("COOKTOP_SLOW_LIMIT", "").strip()
    if not raw:
        return LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"COOKTOP_SLOW_LIMIT={raw!r}: expected seconds, e.g. 20") from None
    if value < 0:
        raise pytest.UsageError(f"COOKTOP_SLOW_LIMIT={raw!r}: expected seconds >= 0")
    return value


def strict() -> bool:
    """True when ``COOKTOP_SLOW_STRICT`` is set (not ``0``): an unmarked slow test fails."""
    return os.environ.get("COOKTOP_SLOW_STRICT", "") not in ("", "0")


#: (node id, seconds) of the unmarked tests past the limit in this run (reported at the end)
_SLOW: list[tuple[str, float]] = []
#: the user property that carries an unmarked slow call's seconds from the report to the summary
_PROPERTY = "cooktop_unmarked_slow_s"


def _reason(item: pytest.Item) -> str:
    m = item.get_closest_marker("slow")
    if m is None:
        return ""
    return str(m.kwargs.get("reason") or (m.args[0] if m.args else "")).strip()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow(reason): the test's call takes more than 20 s on a 2-core machine; "
                                       "reason: why it cannot be cheaper")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    bad = [it.nodeid for it in items if it.get_closest_marker("slow") is not None and not _reason(it)]
    if bad:
        raise pytest.UsageError("@pytest.mark.slow needs reason='why it cannot be cheaper': " + ", ".join(bad[:5]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    lim = limit()
    if call.when != "call" or not rep.passed or lim <= 0 or call.duration <= lim or _reason(item):
        return
    if not strict():
        # kept on the report: under pytest-xdist the summary is written by the controller, which
        # sees the workers' reports (and their user_properties), not this process's lists
        rep.user_properties.append((_PROPERTY, call.duration))
        return
    rep.outcome = "failed"
    rep.longrepr = (f"{item.nodeid}: its call took {call.duration:.1f} s, more than {lim:g} s, without "
                    "@pytest.mark.slow(reason='...'): make it cheaper (a session fixture, fewer cases) or mark it "
                    "and say why (tests/slowguard.py)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the unmarked slow calls (in the process that writes the summary, the xdist controller
    included)."""
    for key, value in report.user_properties:
        if key == _PROPERTY:
            _SLOW.append((report.nodeid, float(value)))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """List the unmarked tests past the limit (report mode)."""
    if not _SLOW:
        return
    terminalreporter.write_sep("=", f"unmarked slow tests (over {limit():g} s; COOKTOP_SLOW_STRICT=1 fails them)")
    for nodeid, seconds in sorted(_SLOW, key=lambda x: -x[1]):
        terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
