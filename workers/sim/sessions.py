"""Multi-turn agentic sessions for the virtual-time lab: a closed loop in which each turn waits for the answer
to the previous one, and each turn's prompt extends the previous prompt and answer.

``concurrency`` streams each run one session after another. A session's first prompt is a ``shared_tokens``
beginning common to every session (the agent's system prompt and tool schemas) plus a first user message; each
later turn appends the previous answer and a new message (a tool result or the user's reply), ``think_s`` after
that answer (the tool's run time). After ``turns`` turns the stream starts a new session. Each request carries
its prompt's block hashes (``workers.sim.prompt_tokens.SessionBlocks``), so the engines' prefix caches see the
sharing. Arrivals stop at ``duration_s``. Lengths are tokens, times seconds of virtual time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from workers.sim.arrivals import Lengths, LoadContext, RequestSpec
from workers.sim.prompt_tokens import SessionBlocks


@dataclass(frozen=True, slots=True)
class SessionShape:
    """What one session looks like."""

    turns: int = 8
    shared_tokens: int = 8000
    """The beginning every session shares."""
    first_tokens: Lengths = field(default_factory=lambda: Lengths(2000, 0.5))
    """The first user message."""
    turn_tokens: Lengths = field(default_factory=lambda: Lengths(1500, 0.8))
    """What each later turn appends besides the previous answer."""
    answer_tokens: Lengths = field(default_factory=lambda: Lengths(400, 0.6))
    think_s: float = 2.0
    workload: str = "code"
    tag: str = ""

    def __post_init__(self) -> None:
        if self.turns < 1 or self.shared_tokens < 0 or self.think_s < 0:
            raise ValueError("turns: must be ≥ 1; shared_tokens, think_s: must be ≥ 0")


@dataclass(slots=True)
class _Stream:
    session: int
    turn: int
    context: int
    """Tokens of the session so far: the last prompt and its answer."""


class SessionLoad:
    """``concurrency`` closed-loop streams of multi-turn sessions (see the module docstring); ``seed`` tells
    this load's sessions apart from another's. Streams start ``stagger_s`` apart at most (uniformly drawn)."""

    def __init__(
        self,
        shape: SessionShape,
        *,
        concurrency: int,
        duration_s: float,
        stagger_s: float = 10.0,
        seed: int = 0,
    ) -> None:
        if concurrency < 1 or not duration_s > 0 or stagger_s < 0:
            raise ValueError("concurrency: must be ≥ 1; duration_s: > 0; stagger_s: ≥ 0")
        self.shape = shape
        self.concurrency = concurrency
        self.duration_s = duration_s
        self.stagger_s = stagger_s
        self._seed = seed
        self._sessions = itertools.count()
        self._streams: dict[int, _Stream] = {}
        self.sessions_started = 0

    def start(self, ctx: LoadContext) -> None:
        for stream in range(self.concurrency):
            self._streams[stream] = self._new_session()
            self._submit(ctx, stream, ctx.rng.uniform(0.0, self.stagger_s))

    def on_stream_done(self, stream: int, ctx: LoadContext) -> None:
        state = self._streams[stream]
        state.turn += 1
        if state.turn >= self.shape.turns:
            self._streams[stream] = self._new_session()
        self._submit(ctx, stream, ctx.now_s + self.shape.think_s)

    def _new_session(self) -> _Stream:
        self.sessions_started += 1
        return _Stream(session=hash((self._seed, next(self._sessions))), turn=0, context=self.shape.shared_tokens)

    def _submit(self, ctx: LoadContext, stream: int, at_s: float) -> None:
        if at_s >= self.duration_s:
            return
        shape, state, rng = self.shape, self._streams[stream], ctx.rng
        added = (shape.first_tokens if state.turn == 0 else shape.turn_tokens).sample(rng)
        prompt = state.context + added
        answer = shape.answer_tokens.sample(rng)
        state.context = prompt + answer
        blocks = SessionBlocks(state.session, prompt, shared_tokens=shape.shared_tokens, shared=self._seed)
        spec = RequestSpec(shape.workload, prompt, answer, tag=shape.tag, block_hashes=blocks)
        ctx.submit_at(at_s, spec, stream=stream, phase=f"turn-{state.turn}")
