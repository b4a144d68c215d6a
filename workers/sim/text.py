"""Approximate tokenisation and deterministic generated text for the simulated worker.

Token counting: the simulator has no tokenizer, so a text of n characters counts as ceil(n / 4) tokens (about
right for English with BPE vocabularies), at least 1; a chat request adds ``CHAT_TOKENS_PER_MESSAGE`` per
message and ``CHAT_REPLY_PRIMING_TOKENS`` for the reply, as chat templates do. A prompt given as token ids
counts its ids. Benchmarks that need exact counts send ``gearshift_prompt_tokens``.

Generated text: each output token is one word from a fixed list, drawn by a ``random.Random`` seeded by
``choice_seed``. Greedy and seeded text depends only on the model, the prompt and the request seed, so every
replica gives the same answer, streamed or not, whatever its batch — as a batch-invariant engine would. (Real
vLLM is not batch-invariant: its greedy text can drift between replicas and batch sizes.)
"""

from __future__ import annotations

import hashlib
import math
import random

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_REPLY_PRIMING_TOKENS = 3
GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this mean greedy sampling (vLLM's ``_SAMPLING_EPS``)."""

_WORD_LIST = (
    "the of and to in is that for it as with was on be by this are from at or an which have not one all "
    "but they were their has can more its been if will there would when who so what about into some other "
    "time than only two then these also could any new may like after first most over such through where "
    "model token draft gear speed fleet batch stream worker expert layer cache shift accept verify load"
)
_WORDS = tuple(_WORD_LIST.split())
_PUNCTUATION = (".", ",")


def count_text_tokens(text: str) -> int:
    """Approximate token count of ``text``: ceil(characters / 4), at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def count_chat_tokens(contents: list[str]) -> int:
    """Approximate prompt tokens of a chat: each message's text plus template overhead."""
    body = sum(math.ceil(len(c) / CHARS_PER_TOKEN) for c in contents)
    return body + CHAT_TOKENS_PER_MESSAGE * len(contents) + CHAT_REPLY_PRIMING_TOKENS


def text_seed(*parts: object) -> int:
    """A stable 64-bit seed from ``parts`` (independent of Python's hash randomisation)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def is_greedy(temperature: float | None) -> bool:
    """Whether a request's temperature means greedy sampling (None is vLLM's default, 1.0: sampled)."""
    return temperature is not None and temperature < GREEDY_TEMPERATURE


def choice_seed(
    *, model: str, prompt: object, choice: int, temperature: float | None, request_seed: int | None, worker_seed: int
) -> int:
    """The seed of one choice's text and pseudo end-of-sequence.

    Greedy: the model and the prompt only (greedy decoding ignores the request seed). Seeded sampling: also
    the request seed, choice ``i`` drawing with ``seed + i`` as vLLM's child requests do. Unseeded sampling:
    also the worker's seed and the choice index, so replicas may answer differently.
    """
    if is_greedy(temperature):
        return text_seed(model, prompt)
    if request_seed is not None:
        return text_seed(model, prompt, request_seed + choice)
    return text_seed(model, prompt, "unseeded", worker_seed, choice)


class TextStream:
    """Deterministic word-per-token text; ``take(n)`` returns the next n tokens' texts."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._since_stop = 0
        self._started = False

    def take(self, tokens: int) -> list[str]:
        return [self._token() for _ in range(tokens)]

    def _token(self) -> str:
        rng = self._rng
        self._since_stop += 1
        if self._started and self._since_stop > 4 and rng.random() < 0.12:
            self._since_stop = 0
            return rng.choice(_PUNCTUATION)
        word = rng.choice(_WORDS)
        if not self._started:
            self._started = True
            return word.capitalize()
        return " " + word


def pseudo_eos_length(seed: int, mean_tokens: int) -> int:
    """Tokens until a pseudo end-of-sequence: geometric with the given mean, at least 1."""
    if mean_tokens <= 1:
        return 1
    u = random.Random(seed).random()
    p = 1.0 / mean_tokens
    return 1 + int(math.log1p(-u) / math.log1p(-p))
