"""One OpenAI request's generation on the simulated engine: its choices, their text, stop strings, finish.

A request with P prompts and ``n`` choices becomes P·n engine requests (as in vLLM). Each engine step's
delivery of a choice's tokens becomes one delta (one SSE chunk, as vLLM V1 streams), its text from the
choice's deterministic ``TextStream``; stop strings end a choice early (the text before the stop string is
kept, the step's tokens after the one completing it are dropped, as vLLM does, and the engine request is
aborted), and text that could be the start of a stop string is held back until it is known not to be (the
step's delta is still sent, with the text it may release, possibly none).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from workers.sim.driver import Delivery, RealTimeDriver
from workers.sim.engine import SimRequest
from workers.sim.text import TextStream, choice_seed, pseudo_eos_length
from workers.sim.tools import ScriptedText


class EngineFailed(RuntimeError):
    """The engine loop failed while this request was in it."""


@dataclass(frozen=True, slots=True)
class PromptSpec:
    key: object
    """What identifies the prompt's content (its text or token ids), for the text seed."""
    tokens: int
    block_hashes: Sequence[int] = ()
    """Hashes of its full KV blocks, for the prefix cache (``workers.sim.prompt_tokens``)."""


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    model: str
    """Served model name: part of every text seed."""
    prompts: list[PromptSpec]
    n: int
    max_tokens: list[int]
    """Completion limit per prompt, tokens."""
    stops: list[str]
    workload: str
    priority: int
    temperature: float | None
    """The request's temperature, which only tells greedy (< 1e-5) from sampled text; None = sampled."""
    request_seed: int | None
    ignore_eos: bool
    eos_mean_tokens: int | None
    worker_seed: int
    """Seeds unseeded sampled text only."""
    script: str | None = None
    """A fixed output instead of generated words (a tool call's arguments, ``workers.sim.tools``): every choice
    gives it out, ends with ``stop`` once it is complete, or with ``length`` when ``max_tokens`` cuts it short."""


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """What one engine step gave one choice."""

    index: int
    text: str
    tokens: int
    """New output tokens of the step: 1 + accepted drafts (at most k + 1), or those through the token that
    completes a stop string."""
    finish_reason: str | None = None
    """``length`` or ``stop`` on a choice's last delta, else None."""
    stop_reason: str | None = None
    """The stop string that ended the choice, if one did."""


@dataclass(slots=True)
class _Choice:
    index: int
    request_id: str
    text: TextStream | ScriptedText
    eos_stop: bool
    tokens: int = 0
    pending: str = ""
    done: bool = False


@dataclass
class Generation:
    """Submits a request's choices to the driver and yields their text as the engine produces it."""

    driver: RealTimeDriver
    spec: GenerationSpec
    id_prefix: str = "cmpl"
    request_id: str = field(init=False)
    choices: list[_Choice] = field(init=False, default_factory=list)
    _first_requests: list[SimRequest] = field(init=False, default_factory=list)
    """Each prompt's first choice on the engine (where its prefix-cache hit is recorded)."""
    _queue: asyncio.Queue[Delivery] = field(init=False, default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.request_id = f"{self.id_prefix}-{uuid.uuid4().hex}"

    @property
    def prompt_tokens(self) -> int:
        return sum(p.tokens for p in self.spec.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(c.tokens for c in self.choices)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the engine's prefix cache (each prompt's first choice, as vLLM reports it)."""
        return sum(r.cached_tokens for r in self._first_requests)

    def choice_usage(self, index: int) -> tuple[int, int]:
        """(prompt tokens, completion tokens so far) of one choice, as vLLM's per-choice streaming usage."""
        return self.spec.prompts[index // self.spec.n].tokens, self.choices[index].tokens

    def submit(self) -> None:
        """Queue every choice on the engine; raises ``ValueError`` (after undoing) if the engine refuses one."""
        spec = self.spec
        try:
            for p_index, prompt in enumerate(spec.prompts):
                for i in range(spec.n):
                    self._submit_choice(p_index, prompt, i)
        except ValueError:
            self.abort()
            raise

    def _submit_choice(self, p_index: int, prompt: PromptSpec, i: int) -> None:
        spec = self.spec
        index = p_index * spec.n + i
        seed = choice_seed(
            model=spec.model,
            prompt=prompt.key,
            choice=i,
            temperature=spec.temperature,
            request_seed=spec.request_seed,
            worker_seed=spec.worker_seed,
        )
        limit = spec.max_tokens[p_index]
        eos_stop = False
        text: TextStream | ScriptedText = TextStream(seed)
        if spec.script is not None:
            text = ScriptedText(spec.script)
            eos_stop, limit = text.tokens <= limit, min(limit, text.tokens)
        elif spec.eos_mean_tokens is not None and not spec.ignore_eos:
            natural = pseudo_eos_length(seed ^ 0x5EED, spec.eos_mean_tokens)
            eos_stop, limit = natural < limit, min(limit, natural)
        choice = _Choice(index, f"{self.request_id}-{index}", text, eos_stop)
        req = SimRequest(
            choice.request_id, prompt.tokens, limit, spec.workload, priority=spec.priority,
            block_hashes=prompt.block_hashes,
        )  # fmt: skip
        self.driver.submit(req, self._queue, index)
        if i == 0:
            self._first_requests.append(req)
        self.choices.append(choice)

    def abort(self) -> None:
        for c in self.choices:
            if not c.done:
                c.done = True
                self.driver.abort(c.request_id)

    async def deltas(self) -> AsyncGenerator[ChoiceDelta, None]:
        """One delta per engine step that gave a choice tokens, ending with each choice's finish; aborts what is
        left on exit."""
        remaining = sum(not c.done for c in self.choices)
        try:
            while remaining:
                delivery = await self._queue.get()
                if delivery.failed:
                    raise EngineFailed(f"{self.request_id}: the simulated engine failed; see the worker's log")
                choice = self.choices[delivery.choice]
                if choice.done:
                    continue
                delta = self._advance(choice, delivery)
                if delta.finish_reason is not None:
                    remaining -= 1
                yield delta
        finally:
            self.abort()

    def _advance(self, choice: _Choice, delivery: Delivery) -> ChoiceDelta:
        pieces = choice.text.take(delivery.tokens)
        start = len(choice.pending)
        choice.pending += "".join(pieces)
        stops = self.spec.stops
        hits = [(choice.pending.find(s), s) for s in stops if s in choice.pending]
        if hits:
            at, stop = min(hits)
            kept = _tokens_through(pieces, start, at + len(stop))
            choice.tokens += kept
            choice.done = True
            self.driver.abort(choice.request_id)
            return ChoiceDelta(choice.index, choice.pending[:at], kept, "stop", stop)
        choice.tokens += delivery.tokens
        if delivery.finished:
            choice.done = True
            text, choice.pending = choice.pending, ""
            return ChoiceDelta(choice.index, text, delivery.tokens, "stop" if choice.eos_stop else "length")
        hold = max((len(s) - 1 for s in stops), default=0)
        cut = max(len(choice.pending) - hold, 0)
        text, choice.pending = choice.pending[:cut], choice.pending[cut:]
        return ChoiceDelta(choice.index, text, delivery.tokens)


def _tokens_through(pieces: list[str], start: int, end: int) -> int:
    """How many of a step's token texts, appended at text offset ``start``, it takes to reach offset ``end``:
    vLLM keeps the tokens through the one completing a stop string and drops the rest of the step's."""
    reached = start
    for n, piece in enumerate(pieces, 1):
        reached += len(piece)
        if reached >= end:
            return n
    return len(pieces)
