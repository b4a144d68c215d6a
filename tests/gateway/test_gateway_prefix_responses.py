"""Prefix-affinity blocks of ``/v1/responses`` bodies: ``instructions`` and the ``input`` items (a string, message
items, function calls and their outputs) laid out as the chat messages a worker renders them as, so a Responses
conversation's next turn shares its previous turn's blocks, as a chat one does."""

from __future__ import annotations

from typing import Any

from gateway.routing.prefix import block_hashes, prompt_text, request_blocks

from .harness import MODEL

INSTRUCTIONS = "You are a careful coding agent; read before you write. " * 40


def _blocks(body: dict[str, Any]) -> tuple[int, ...]:
    return request_blocks(body, chat=True, block_chars=256, max_blocks=64)


def test_a_responses_body_lays_out_as_the_same_chat() -> None:
    responses = {"model": MODEL, "instructions": INSTRUCTIONS, "input": "Fix the parser."}
    chat = {
        "model": MODEL,
        "messages": [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Fix the parser."}],
    }
    assert prompt_text(responses, chat=True) == prompt_text(chat, chat=True)
    assert len(_blocks(responses)) == len(prompt_text(responses, chat=True)) // 256 > 0


def test_a_responses_next_turn_shares_the_previous_turns_blocks() -> None:
    first: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": "Run the tests. " * 20}]}]
    turn = {"model": MODEL, "instructions": INSTRUCTIONS, "input": first}
    call = {"type": "function_call", "call_id": "c1", "name": "run_tests", "arguments": '{"path": "tests/"}'}
    output = {"type": "function_call_output", "call_id": "c1", "output": "3 failed, 41 passed. " * 30}
    later = {**turn, "input": [*first, call, output, {"role": "user", "content": "Fix the failures."}]}
    before, after = _blocks(turn), _blocks(later)
    assert before
    assert after[: len(before)] == before
    assert len(after) > len(before) + 2, "the call's output is in the prefix"
    text = prompt_text(later, chat=True)
    assert '"name":"run_tests"' in text
    assert "3 failed, 41 passed." in text


def test_the_instructions_are_part_of_the_prefix_and_a_body_without_input_has_none() -> None:
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "input": "Fix the parser."}
    other = {**body, "instructions": "X" + INSTRUCTIONS}
    assert _blocks(body), "the instructions fill blocks"
    assert set(_blocks(other)).isdisjoint(_blocks(body))
    assert prompt_text({"model": MODEL, "instructions": INSTRUCTIONS}, chat=True) == ""
    assert block_hashes(prompt_text({"model": MODEL, "input": 7}, chat=True), block_chars=512, max_blocks=8) == ()
