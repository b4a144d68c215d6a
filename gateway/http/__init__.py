"""The gateway's HTTP side: the ASGI entry (``entry``), the app factory (``app``), the uvicorn server and its
protocol (``serve``, ``protocol``), and the FastAPI routes besides the completions (``tenant``, ``admin``,
``ops``) with their dependencies (``deps``) and OpenAPI document (``openapi``)."""
