"""``/v1/completions`` and ``/v1/chat/completions`` of the simulated worker, in vLLM's request and response
shapes, streaming (SSE) and not.

A stream is shaped as vLLM 0.32's serving code (``entrypoints/openai/{chat_completion,completion}/serving.py``)
sends it: one chunk per engine step per choice with that step's tokens (up to k + 1 under speculation), the
chat role delta when the first output arrives (so the first event marks the first token), ``finish_reason``
on a choice's last chunk, then the usage chunk if ``stream_options.include_usage``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from workers.sim.errors import BadRequest, NotFound, error_body, from_validation_error
from workers.sim.generation import ChoiceDelta, EngineFailed, Generation, GenerationSpec, PromptSpec
from workers.sim.prompt_tokens import block_hashes, chat_token_text, text_token_text
from workers.sim.protocol import ChatCompletionRequest, CompletionRequest, _GenerationRequest
from workers.sim.text import count_chat_tokens, count_text_tokens, is_greedy
from workers.sim.tools import ChatRendering, plan_tool_call, tool_prompt_tokens
from workers.sim.worker import WORKER, SimWorker

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's (and vLLM's) default ``max_tokens`` for ``/v1/completions``."""

B = TypeVar("B", bound=BaseModel)
Chunk = Callable[[ChoiceDelta], dict[str, Any]]
RoleChunk = Callable[[int], dict[str, Any]]


async def read_body(request: web.Request, model: type[B]) -> B:
    try:
        data = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from exc


def _check_common(worker: SimWorker, body: _GenerationRequest) -> None:
    s = worker.settings
    if body.model is not None and body.model != s.model:
        raise NotFound(f"The model `{body.model}` does not exist.", param="model")
    if body.stream_options is not None and not body.stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
    if body.priority != 0 and s.scheduling == "fcfs":
        raise BadRequest(f"Got priority {body.priority} but Priority scheduling is not enabled.", param="priority")
    if is_greedy(body.temperature) and body.n > 1:
        raise BadRequest(f"n must be 1 when using greedy sampling, got {body.n}.", param="n")


def _completion_limit(worker: SimWorker, prompt_tokens: int, requested: int | None, default: int) -> int:
    """Tokens the completion may have: the request's ``max_tokens``, else ``default`` within the context."""
    ctx = worker.settings.context_window
    if prompt_tokens >= ctx:
        raise BadRequest(
            f"This model's maximum context length is {ctx} tokens. However, your request has {prompt_tokens} "
            "input tokens. Please reduce the length of the input messages.",
            param="messages",
        )
    if requested is None:
        return min(default, ctx - prompt_tokens)
    if prompt_tokens + requested > ctx:
        raise BadRequest(
            f"This model's maximum context length is {ctx} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the messages, {requested} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="max_tokens",
        )
    return requested


def _spec(
    worker: SimWorker, request: web.Request, body: _GenerationRequest, prompts: list[PromptSpec], limits: list[int]
) -> GenerationSpec:
    workload = body.gearshift_workload or request.headers.get("x-gearshift-workload") or worker.default_workload
    return GenerationSpec(
        model=worker.settings.model,
        prompts=prompts,
        n=body.n,
        max_tokens=limits,
        stops=body.stop_strings(),
        workload=workload,
        priority=body.priority,
        temperature=body.temperature,
        request_seed=body.seed,
        ignore_eos=body.ignore_eos,
        eos_mean_tokens=worker.settings.eos_mean_tokens,
        worker_seed=worker.settings.seed,
    )


def _start(worker: SimWorker, spec: GenerationSpec, prefix: str) -> Generation:
    generation = Generation(worker.driver, spec, id_prefix=prefix)
    try:
        generation.submit()
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    return generation


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """vLLM's usage block as a stream's usage chunk carries it."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _response_usage(worker: SimWorker, g: Generation) -> dict[str, Any]:
    """vLLM's usage block of a non-streamed response."""
    details = None
    if worker.settings.enable_prompt_tokens_details:
        details = {"cached_tokens": g.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}
    return {**_usage(g.prompt_tokens, g.completion_tokens), "prompt_tokens_details": details}


def _final_usage(worker: SimWorker, g: Generation) -> dict[str, Any]:
    """vLLM's usage block of a stream's usage chunk (serialised without its null fields)."""
    usage = _usage(g.prompt_tokens, g.completion_tokens)
    if worker.settings.enable_prompt_tokens_details:
        usage["prompt_tokens_details"] = {"cached_tokens": g.cached_tokens}
    return usage


async def completions(request: web.Request) -> web.StreamResponse:
    worker = request.app[WORKER]
    body = await read_body(request, CompletionRequest)
    _check_common(worker, body)
    if not body.prompts():
        raise BadRequest("prompt: must not be empty", param="prompt")
    prompts = []
    for p in body.prompts():
        tokens = body.gearshift_prompt_tokens or (count_text_tokens(p) if isinstance(p, str) else len(p))
        hashes = block_hashes(text_token_text(p) if isinstance(p, str) else p, length=tokens)
        prompts.append(PromptSpec(p if isinstance(p, str) else tuple(p), tokens, hashes))
    limits = [_completion_limit(worker, p.tokens, body.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS) for p in prompts]
    generation = _start(worker, _spec(worker, request, body, prompts, limits), "cmpl")
    head = {
        "id": generation.request_id,
        "object": "text_completion",
        "created": int(worker.clock.wall()),
        "model": worker.settings.model,
    }

    def chunk(d: ChoiceDelta) -> dict[str, Any]:
        choice = {
            "index": d.index,
            "text": d.text,
            "logprobs": None,
            "finish_reason": d.finish_reason,
            "stop_reason": d.stop_reason,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        return {**head, "choices": [choice]}

    if body.stream:
        return await _stream(request, generation, body, head, chunk, continuous_details={})
    texts, finish = await _collect(generation)
    choices: list[dict[str, Any]] = [
        {
            "index": i,
            "text": texts[i],
            "logprobs": None,
            "finish_reason": finish[i][0],
            "stop_reason": finish[i][1],
            "prompt_logprobs": None,
        }
        for i in sorted(texts)
    ]
    return web.json_response({**head, "choices": choices, "usage": _response_usage(worker, generation)}, dumps=_dumps)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    worker = request.app[WORKER]
    body = await read_body(request, ChatCompletionRequest)
    _check_common(worker, body)
    messages = [m.model_dump() for m in body.messages]
    call = plan_tool_call(body.tools, body.tool_choice, messages, model=worker.settings.model)
    rendering = ChatRendering(call)
    contents = [m.text() for m in body.messages]
    tokens = body.gearshift_prompt_tokens or count_chat_tokens(contents) + tool_prompt_tokens(body.tools, messages)
    turns = tuple((m.role, c) for m, c in zip(body.messages, contents, strict=True))
    prompt = PromptSpec(turns, tokens, block_hashes(chat_token_text(turns), length=tokens))
    limit = _completion_limit(worker, tokens, body.requested_max_tokens(), worker.settings.default_max_tokens)
    spec = _spec(worker, request, body, [prompt], [limit])
    generation = _start(worker, spec if call is None else replace(spec, script=call.arguments), "chatcmpl")
    model = worker.settings.model
    head = {
        "id": generation.request_id,
        "object": "chat.completion.chunk",
        "created": int(worker.clock.wall()),
        "model": model,
    }

    def chunk(d: ChoiceDelta) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": d.index,
            "delta": rendering.delta(d.index, d.text),
            "logprobs": None,
            "finish_reason": rendering.finish_reason(d.finish_reason),
        }
        if d.finish_reason is not None:
            choice["stop_reason"] = d.stop_reason
        choice["token_ids"] = None
        return {**head, "choices": [choice]}

    def role_chunk(index: int) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**head, "choices": [choice], "prompt_token_ids": None, "prompt_text": None}

    if body.stream:
        details = {"completion_tokens_details": None}
        return await _stream(request, generation, body, head, chunk, role_chunk=role_chunk, continuous_details=details)
    texts, finish = await _collect(generation)
    choices: list[dict[str, Any]] = [
        {
            "index": i,
            "message": rendering.message(texts[i]),
            "logprobs": None,
            "finish_reason": rendering.finish_reason(finish[i][0]),
            "stop_reason": finish[i][1],
        }
        for i in sorted(texts)
    ]
    response = {**head, "object": "chat.completion", "choices": choices, "usage": _response_usage(worker, generation)}
    return web.json_response(response, dumps=_dumps)


async def _collect(generation: Generation) -> tuple[dict[int, str], dict[int, tuple[str | None, str | None]]]:
    texts: dict[int, list[str]] = {c.index: [] for c in generation.choices}
    finish: dict[int, tuple[str | None, str | None]] = {}
    async for d in generation.deltas():
        texts[d.index].append(d.text)
        if d.finish_reason is not None:
            finish[d.index] = (d.finish_reason, d.stop_reason)
    return {i: "".join(t) for i, t in texts.items()}, finish


async def _stream(
    request: web.Request,
    generation: Generation,
    body: _GenerationRequest,
    head: dict[str, Any],
    chunk: Chunk,
    *,
    role_chunk: RoleChunk | None = None,
    continuous_details: dict[str, Any],
) -> web.StreamResponse:
    """Server-sent events as vLLM sends them; a client that goes away aborts the request's engine work.

    ``continuous_details`` are the extra (null) fields vLLM puts in each chunk's ``continuous_usage_stats``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    options = body.stream_options
    continuous = options is not None and options.continuous_usage_stats

    def with_usage(payload: dict[str, Any], index: int, *, completion_tokens: int | None = None) -> dict[str, Any]:
        if continuous:
            prompt, completion = generation.choice_usage(index)
            tokens = completion if completion_tokens is None else completion_tokens
            payload["usage"] = {**_usage(prompt, tokens), **continuous_details}
        return payload

    try:
        await response.prepare(request)  # in the try: a client gone before the headers is an abort too
        role_due = role_chunk is not None
        async for d in generation.deltas():
            if role_chunk is not None and role_due:  # vLLM sends the role with the engine's first output
                role_due = False
                for c in generation.choices:
                    await _send(response, with_usage(role_chunk(c.index), c.index, completion_tokens=0))
            await _send(response, with_usage(chunk(d), d.index))
        if options is not None and options.include_usage:
            usage = _final_usage(request.app[WORKER], generation)
            await _send(response, {**head, "choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except EngineFailed as exc:  # the stream has started: report in-band, as vLLM does
        await _send(response, error_body(str(exc), "InternalServerError", 500))
        await response.write(b"data: [DONE]\n\n")
    except ConnectionResetError:
        pass  # the client went away; ``finally`` aborts what the engine still runs for it
    finally:
        generation.abort()
    return response


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + orjson.dumps(payload) + b"\n\n")


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
