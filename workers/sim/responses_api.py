"""``POST /v1/responses`` of the simulated worker: OpenAI's Responses API for text, streamed and not, in vLLM 0.32's
shapes (``entrypoints/openai/responses/{api_router,serving,streaming_events}.py``).

The input (a string, or a list of messages whose content is a string or ``input_text`` parts, and tool outputs)
and the ``instructions`` are the prompt, counted as a chat; ``max_output_tokens`` limits the answer. The answer
is one ``message`` output item with one ``output_text`` part (no tool calls: ``tools`` are accepted and not
called). A stream sends, as vLLM does, ``event: TYPE`` / ``data: JSON`` pairs with a ``sequence_number`` on each:
``response.created``, ``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
one ``response.output_text.delta`` per engine step, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, ``response.completed`` (the whole response with
its usage, and status ``incomplete`` when ``max_output_tokens`` cut it), then the end of the body — no
``[DONE]``. Usage is ``input_tokens`` / ``output_tokens``.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from workers.sim.errors import BadRequest, NotFound
from workers.sim.generation import EngineFailed, Generation, GenerationSpec, PromptSpec
from workers.sim.openai_api import read_body
from workers.sim.text import count_chat_tokens
from workers.sim.worker import WORKER, SimWorker

PATH = "/v1/responses"


class ResponsesRequest(BaseModel):
    """The fields of vLLM's ``ResponsesRequest`` the simulator reads; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: bool | None = False
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: float | None = None
    seed: int | None = None
    priority: int = 0
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    gearshift_workload: str | None = None
    gearshift_prompt_tokens: Annotated[int, Field(ge=1)] | None = None

    def turns(self) -> tuple[tuple[str, str], ...]:
        """(role, text) of the instructions and every input item (a tool output counts as a ``tool`` turn)."""
        turns = [("system", self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            return (*turns, ("user", self.input))
        for item in self.input:
            if item.get("type") == "function_call_output":
                turns.append(("tool", str(item.get("output", ""))))
            elif item.get("type") == "function_call":
                turns.append(("assistant", f"{item.get('name', '')}{item.get('arguments', '')}"))
            else:
                turns.append((str(item.get("role", "user")), _text(item.get("content"))))
        return tuple(turns)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _check(worker: SimWorker, body: ResponsesRequest) -> None:
    if body.model is not None and body.model != worker.settings.model:
        raise NotFound(f"The model `{body.model}` does not exist.", param="model")
    if body.priority != 0 and worker.settings.scheduling == "fcfs":
        raise BadRequest(f"Got priority {body.priority} but Priority scheduling is not enabled.", param="priority")
    if isinstance(body.input, list) and not body.input:
        raise BadRequest("input: must not be empty", param="input")


def _limit(worker: SimWorker, prompt_tokens: int, requested: int | None) -> int:
    ctx = worker.settings.context_window
    if prompt_tokens >= ctx or (requested is not None and prompt_tokens + requested > ctx):
        total = prompt_tokens + (requested or 0)
        raise BadRequest(
            f"This model's maximum context length is {ctx} tokens. However, your request has {total} tokens "
            f"({prompt_tokens} in the input). Please reduce the length of the input or of max_output_tokens.",
            param="input",
        )
    return requested if requested is not None else min(worker.settings.default_max_tokens, ctx - prompt_tokens)


def _usage(g: Generation) -> dict[str, Any]:
    """vLLM's ``ResponseUsage``."""
    return {
        "input_tokens": g.prompt_tokens,
        "input_tokens_details": {"cached_tokens": g.cached_tokens},
        "output_tokens": g.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": g.prompt_tokens + g.completion_tokens,
    }


class _Response:
    """The response object of one request, in its states."""

    def __init__(self, worker: SimWorker, body: ResponsesRequest, limit: int) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.head: dict[str, Any] = {
            "id": self.id, "created_at": int(worker.clock.wall()), "incomplete_details": None,
            "instructions": body.instructions, "metadata": None, "model": worker.settings.model,
            "object": "response", "parallel_tool_calls": True,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "tool_choice": body.tool_choice, "tools": body.tools,
            "top_p": 1.0 if body.top_p is None else body.top_p, "background": False, "max_output_tokens": limit,
            "max_tool_calls": None, "previous_response_id": None, "prompt": None, "reasoning": None,
            "service_tier": "auto", "text": None, "top_logprobs": None, "truncation": "disabled", "user": None,
        }  # fmt: skip

    def part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": None}

    def message(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [self.part(text)]
        return {"id": self.item_id, "type": "message", "role": "assistant", "content": content, "status": status}

    def body(self, text: str | None, status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        output = [] if text is None else [self.message(text, "completed")]
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {**self.head, "output": output, "status": status, "usage": usage, "incomplete_details": incomplete}


async def responses(request: web.Request) -> web.StreamResponse:
    worker = request.app[WORKER]
    body = await read_body(request, ResponsesRequest)
    _check(worker, body)
    turns = body.turns()
    tokens = body.gearshift_prompt_tokens or count_chat_tokens([text for _, text in turns])
    limit = _limit(worker, tokens, body.max_output_tokens)
    workload = body.gearshift_workload or request.headers.get("x-gearshift-workload") or worker.default_workload
    spec = GenerationSpec(
        model=worker.settings.model, prompts=[PromptSpec(turns, tokens)], n=1, max_tokens=[limit], stops=[],
        workload=workload, priority=body.priority, temperature=body.temperature, request_seed=body.seed,
        ignore_eos=False, eos_mean_tokens=worker.settings.eos_mean_tokens, worker_seed=worker.settings.seed,
    )  # fmt: skip
    generation = Generation(worker.driver, spec, id_prefix="resp")
    try:
        generation.submit()
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    response = _Response(worker, body, limit)
    if body.stream:
        return await _stream(request, generation, response)
    texts: list[str] = []
    finish = None
    async for d in generation.deltas():
        texts.append(d.text)
        finish = d.finish_reason or finish
    status = "incomplete" if finish == "length" else "completed"
    return web.json_response(response.body("".join(texts), status, _usage(generation)), dumps=_dumps)


async def _stream(request: web.Request, generation: Generation, r: _Response) -> web.StreamResponse:
    """The Responses API's event stream (see the module docstring); a client that leaves aborts the request."""
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    sequence = 0

    async def send(kind: str, **fields: Any) -> None:
        nonlocal sequence
        event = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        await out.write(f"event: {kind}\ndata: ".encode() + orjson.dumps(event) + b"\n\n")

    at = {"output_index": 0, "item_id": r.item_id, "content_index": 0}
    try:
        await out.prepare(request)  # in the try: a client gone before the headers is an abort too
        await send("response.created", response=r.body(None, "in_progress", None))
        await send("response.in_progress", response=r.body(None, "in_progress", None))
        opened = False
        texts: list[str] = []
        finish = None
        async for d in generation.deltas():
            if not opened:  # vLLM opens the item with the engine's first output
                opened = True
                await send("response.output_item.added", output_index=0, item=r.message(None, "in_progress"))
                await send("response.content_part.added", **at, part=r.part(""))
            texts.append(d.text)
            finish = d.finish_reason or finish
            await send("response.output_text.delta", **at, delta=d.text, logprobs=[])
        text = "".join(texts)
        await send("response.output_text.done", **at, text=text, logprobs=[])
        await send("response.content_part.done", **at, part=r.part(text))
        await send("response.output_item.done", output_index=0, item=r.message(text, "completed"))
        status = "incomplete" if finish == "length" else "completed"
        await send("response.completed", response=r.body(text, status, _usage(generation)))  # even when incomplete
        await out.write_eof()
    except EngineFailed as exc:  # the stream has started: report in-band, as vLLM does
        await send("error", code="InternalServerError", message=str(exc), param=None)
    except ConnectionResetError:
        pass  # the client went away; ``finally`` aborts what the engine still runs for it
    finally:
        generation.abort()
    return out


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def add_routes(app: web.Application) -> None:
    app.router.add_post(PATH, responses)
