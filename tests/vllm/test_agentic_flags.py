"""The fleet file's tool-call and reasoning parsers reach vLLM's command line, and vLLM 0.32 knows them.

The argv test is pure. The registry test runs ``parser_probe.py`` in ``.venv-vllm``: vLLM's own argument parser
reads the launcher's command line and vLLM's parser registries load the named parsers (nothing re-implemented).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.config import WorkerConfig, load_fleet
from workers.vllm.launcher import API_SERVER_MODULE, Entrypoint, build_launch

from .probes import run_probe
from .test_gears import KIMI_FLEET

PROBE = Path(__file__).with_name("parser_probe.py")
PROBE_TIMEOUT_S = 180.0
MI355X_FLEET = KIMI_FLEET.with_name("kimi-k3-dspark-mi355x.yaml")


def kimi() -> WorkerConfig:
    worker = load_fleet(KIMI_FLEET).worker("kimi-k3-0")
    assert worker is not None
    return worker


def flags(argv: tuple[str, ...]) -> dict[str, str | None]:
    """The agentic flags of a command line: flag → its value (None for a switch), each at most once."""
    found: dict[str, str | None] = {}
    for flag in ("--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser"):
        assert argv.count(flag) <= 1, f"{flag} appears {argv.count(flag)} times"
        if flag in argv:
            at = argv.index(flag)
            found[flag] = None if flag == "--enable-auto-tool-choice" else argv[at + 1]
    return found


@pytest.mark.parametrize("fleet_file", [KIMI_FLEET, MI355X_FLEET], ids=lambda p: p.stem)
def test_every_k3_worker_starts_with_the_kimi_k3_parsers_and_auto_tool_choice(fleet_file: Path) -> None:
    for worker in load_fleet(fleet_file).workers:
        assert flags(build_launch(worker).argv) == {
            "--enable-auto-tool-choice": None,
            "--tool-call-parser": "kimi_k3",
            "--reasoning-parser": "kimi_k3",
        }


def test_a_worker_without_parsers_gets_no_agentic_flags() -> None:
    worker = kimi().model_copy(update={"tool_call_parser": None, "reasoning_parser": None})
    assert flags(build_launch(worker).argv) == {}
    reasoning_only = kimi().model_copy(update={"tool_call_parser": None})
    assert flags(build_launch(reasoning_only).argv) == {"--reasoning-parser": "kimi_k3"}


def probe(argv: tuple[str, ...]) -> dict[str, Any]:
    """What vLLM makes of ``argv`` (a ``python -m`` launch line) with its own parser and registries."""
    module_at = argv.index(API_SERVER_MODULE)
    return run_probe(PROBE, request={"argv": list(argv[module_at + 1 :])}, timeout_s=PROBE_TIMEOUT_S)


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_vllm_parses_the_k3_command_line_and_registers_its_parsers(vllm_env: None) -> None:
    answer = probe(build_launch(kimi(), entrypoint=Entrypoint.MODULE).argv)
    assert (answer["tool_call_parser"], answer["reasoning_parser"]) == ("kimi_k3", "kimi_k3")
    assert answer["enable_auto_tool_choice"] is True
    assert "kimi_k3" in answer["tool_parsers"]
    assert "kimi_k3" in answer["reasoning_parsers"]
    assert answer["tool_parser_class"]
    assert answer["reasoning_parser_class"]
