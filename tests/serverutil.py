"""Run the cooktop server in-process for tests: uvicorn on a thread, 127.0.0.1, an ephemeral port."""

from __future__ import annotations

import threading
import time


class RunningServer:
    """``create_app(config)`` (or a ready ASGI ``app``: a router) served by uvicorn on a background
    thread; ``stop()`` always ends it.

    Attributes:
        base: ``http://127.0.0.1:PORT``; app: the FastAPI app (``app.state.cooktop`` is the state).
    """

    def __init__(self, config=None, wait_loaded: bool = True, app=None):
        import uvicorn

        from cooktop.server.app import create_app

        self.app = app if app is not None else create_app(config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        if wait_loaded and app is None:
            self.wait_loaded()

    @property
    def state(self):
        return self.app.state.cooktop

    def wait_loaded(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.state.loading:
            if time.monotonic() > deadline:
                raise RuntimeError("the model did not load")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
