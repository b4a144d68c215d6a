"""The simulator's prompt tokens, as far as its prefix cache needs them: the hashes of a prompt's full KV blocks.

The simulator has no tokenizer (``workers.sim.text`` counts about 4 characters a token). For the prefix cache it
also defines *which* tokens a prompt is, deterministically, so that prompts sharing a beginning share blocks:

- **Text prompt** (``/v1/completions``): the text cut into 4-character tokens (the last one padded).
- **Chat** (``/v1/chat/completions``): per message, 4 template tokens naming its role (``<role>`` padded to 16
  characters) then its text cut into 4-character tokens; after the last message, 3 tokens priming the reply.
  That is exactly ``count_chat_tokens``. A multi-turn conversation whose next request repeats the previous
  messages, then the answer and a new user message, shares every token of the previous messages; the priming
  tokens differ, as in a real chat template.
- **Token ids**: the ids themselves.
- With ``gearshift_prompt_tokens`` (an exact length for benchmarks) the stream is cut to that length, or padded
  with tokens drawn from the digest of the whole prompt (so only an identical prompt shares the padding).

Block ``i`` (tokens ``16 i … 16 i + 15``) is identified, as in vLLM, by a hash chained over the blocks before it:
``h_i = blake2b(h_{i-1} ‖ block_i)`` (8 bytes). Only full blocks are hashed. The virtual lab, which has lengths
but no text, names a session's blocks directly (``SessionBlocks``).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence
from typing import overload

from workers.sim.text import CHARS_PER_TOKEN

BLOCK_TOKENS = 16
"""KV cache block size, tokens (vLLM's default ``block_size``)."""
_BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN
_ROLE_CHARS = 4 * CHARS_PER_TOKEN
_PRIMING = "<reply>".ljust(3 * CHARS_PER_TOKEN, "\0")
_MASK = (1 << 64) - 1


def _chain(blocks: Iterator[bytes]) -> tuple[int, ...]:
    out: list[int] = []
    prev = b""
    for block in blocks:
        prev = hashlib.blake2b(prev + block, digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return tuple(out)


def _pad(text: str) -> str:
    return text + "\0" * (-len(text) % CHARS_PER_TOKEN)


def chat_token_text(messages: Sequence[tuple[str, str]]) -> str:
    """A chat's tokens as text, 4 characters a token (see the module docstring)."""
    parts = [f"<{role}>"[:_ROLE_CHARS].ljust(_ROLE_CHARS, "\0") + _pad(content) for role, content in messages]
    return "".join(parts) + _PRIMING


def text_token_text(prompt: str) -> str:
    """A text prompt's tokens as text, 4 characters a token (at least one token)."""
    return _pad(prompt) or "\0" * CHARS_PER_TOKEN


def block_hashes(tokens: str | Sequence[int], *, length: int | None = None) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``tokens`` (token text, 4 characters a token, or token ids), cut or
    padded to ``length`` tokens when given."""
    count = len(tokens) // CHARS_PER_TOKEN if isinstance(tokens, str) else len(tokens)
    length = count if length is None else length
    own = min(count, length) // BLOCK_TOKENS
    if isinstance(tokens, str):
        data = tokens.encode()
        if len(data) == len(tokens):  # ASCII: slice the bytes, one encode for the whole prompt
            blocks = [data[i * _BLOCK_CHARS : (i + 1) * _BLOCK_CHARS] for i in range(own)]
        else:
            blocks = [tokens[i * _BLOCK_CHARS : (i + 1) * _BLOCK_CHARS].encode() for i in range(own)]
    else:
        ids = array("q", tokens)
        blocks = [ids[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS].tobytes() for i in range(own)]
    if length // BLOCK_TOKENS > own:  # padded: the blocks past the prompt's own are named by the whole prompt
        whole = hashlib.blake2b(repr(tokens).encode(), digest_size=8).hexdigest()
        blocks += [f"pad:{whole}:{i}".encode() for i in range(own, length // BLOCK_TOKENS)]
    return _chain(iter(blocks))


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class SessionBlocks(Sequence[int]):
    """The block hashes of the first ``tokens`` tokens of one session's token stream, computed on demand: a
    session only ever appends (each turn's prompt extends the previous prompt and answer), so block ``i`` of any
    of its prompts is the same block. Sessions are told apart by ``session`` (any integer, e.g. seeded); the
    first ``shared_tokens`` tokens are the same in every session of one ``shared`` seed (a common system prompt
    and tool schemas)."""

    __slots__ = ("_base", "_count", "_shared", "_shared_blocks")

    def __init__(self, session: int, tokens: int, *, shared_tokens: int = 0, shared: int = 0) -> None:
        self._base = _mix(session & _MASK)
        self._shared = _mix(_mix(shared & _MASK) ^ 0x5EED)
        self._count = tokens // BLOCK_TOKENS
        self._shared_blocks = shared_tokens // BLOCK_TOKENS

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        i = index % self._count
        return _mix((self._shared if i < self._shared_blocks else self._base) ^ i)
