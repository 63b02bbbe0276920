"""``cooktop serve``: an OpenAI-compatible HTTP server in the shape of llama-server.

``app.create_app(ServerConfig(...))`` builds the FastAPI application
(``app.py``); ``slots.Scheduler`` runs the generations (``slots.py``);
``protocol.py`` turns request bodies into ``Llama`` arguments and errors into
OpenAI-shaped JSON. Needs the ``server`` extra (fastapi, uvicorn).
"""
