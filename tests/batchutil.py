"""Drive several generations through one :class:`~cooktop.engine.batch.BatchDriver` from threads,
as the server's slots do, for tests that compare them with each generation run alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def run_in_driver(engine: Any, jobs: list[Callable[[Any], Any]], timeout: float = 120.0) -> tuple[list[Any], Any]:
    """Run ``jobs[i](seq_i)`` on one thread each, every sequence joined to one BatchDriver.

    Args:
        engine: a loaded :class:`~cooktop.engine.generate.Engine`.
        jobs: one callable per sequence, given its sequence; its return value is collected.
        timeout: seconds each thread is waited for.
    Returns:
        (the jobs' results in order, the closed driver: ``driver.stats`` tells how steps were shared).
    Raises:
        AssertionError: a thread still running after ``timeout``; the first exception a job raised.
    """
    from cooktop.engine.batch import BatchDriver

    seqs = engine.new_sequences(len(jobs))
    drv = BatchDriver(engine.model, seqs)
    got: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    drv.join(len(jobs))

    def run(i: int) -> None:
        try:
            got[i] = jobs[i](seqs[i])
        except BaseException as e:  # re-raised on the test's thread below
            errors.append(e)
        finally:
            drv.leave()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    drv.close()
    assert not any(t.is_alive() for t in threads), "a generation did not finish through the batch driver"
    if errors:
        raise errors[0]
    return got, drv
