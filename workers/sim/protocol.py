"""Request bodies of the OpenAI-compatible endpoints, as vLLM accepts them.

Unknown fields are accepted and ignored, as vLLM does (clients send sampling options the simulator does not
model: top_p, logprobs …; ``temperature`` only tells greedy from sampled text). gearshift adds two optional
fields: ``gearshift_workload`` (the acceptance class) and ``gearshift_prompt_tokens`` (an exact prompt length,
for benchmarks).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    priority: int = 0
    ignore_eos: bool = False
    seed: int | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    gearshift_workload: str | None = None
    gearshift_prompt_tokens: Annotated[int, Field(ge=1)] | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: a string, a list of strings, token ids, or a list of token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content)


class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    """Function tools (``workers.sim.tools``)."""
    tool_choice: str | dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
