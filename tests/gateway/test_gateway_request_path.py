"""The request path as the pipeline walks it: one streamed chat request, followed with ``sys.setprofile``.

A module is *entered* each time a frame of ``gateway.pipeline`` calls into a function of another ``gateway``
module (a new frame: a coroutine resumed after an ``await`` is the same entry). A context manager's enter and exit
count as one, with the call that made it (``__enter__``/``__aenter__``/``__exit__``/``__aexit__`` are not
counted). No stage may be entered more than twice: a feature joins the path as a stage or a plug-in, never as
another call in the pipeline (STYLE 15).
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

from .harness import MODEL, StartUpstreams, make_fleet, make_tenants, serve_gateway

_CONTEXT_DUNDERS = frozenset({"__enter__", "__exit__", "__aenter__", "__aexit__"})


class PathRecorder:
    """Records, in order, the gateway modules the pipeline enters (see the module docstring)."""

    def __init__(self) -> None:
        self.path: list[str] = []
        self._seen: list[FrameType] = []
        """Frames already counted (kept alive, so that an id is never reused)."""

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_name in _CONTEXT_DUNDERS:
            return
        caller = frame.f_back
        if caller is None or caller.f_globals.get("__name__") != "gateway.pipeline":
            return
        module = frame.f_globals.get("__name__", "")
        if module == "gateway.pipeline" or not module.startswith("gateway."):
            return
        if any(f is frame for f in self._seen):
            return
        self._seen.append(frame)
        self.path.append(module)


async def test_one_streamed_chat_enters_no_gateway_module_more_than_twice(upstreams: StartUpstreams) -> None:
    (worker,) = await upstreams(1, chunks=8)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8}
    async with serve_gateway(make_fleet([worker.url]), make_tenants()) as g, g.client() as c:
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 200  # warm: connections, caches
        recorder = PathRecorder()
        sys.setprofile(recorder)
        try:
            async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
                text = (await resp.aread()).decode()
        finally:
            sys.setprofile(None)
    assert resp.status_code == 200
    assert text.endswith("data: [DONE]\n\n")
    print("request path:", " → ".join(recorder.path))
    entered = Counter(recorder.path)
    for stage in ("gateway.intake.admission", "gateway.routing.router", "gateway.upstream.client"):
        assert stage in entered, f"the path missed {stage}: {recorder.path}"
    assert max(entered.values()) <= 2, entered.most_common(3)
