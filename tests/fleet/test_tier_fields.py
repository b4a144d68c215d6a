"""Every field of a tier in the tenants file changes behaviour, a named test shows it, serving code reads it, and the
docs' table (docs/concepts/tiers.md) says what it does (issue 16: ``sheddable`` used to be read nowhere).

``SHOWN_BY`` is the register: a new ``TierConfig`` field fails here until a test of its effect is named, a renamed
or deleted test fails here, and the docs' table must list exactly these fields. Serving code must read the field off
a tier (``reads_tier_field``: parsed attribute loads on a receiver named as a tier; issue 23 defect 8 was a regex
that ``from fleet.speculation import`` and ``entry.priority`` satisfied for any field).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fleet.config import TierConfig

ROOT = Path(__file__).resolve().parents[2]
SERVING = ("gateway", "controller")
"""The packages whose code acts on tiers."""

SHOWN_BY: dict[str, tuple[str, ...]] = {
    "priority": (
        "tests/gateway/test_gateway_routing.py::test_tiers_land_where_the_policy_says_through_the_gateway",
        "tests/gateway/test_gateway_overload.py::test_bands_are_served_in_strict_priority_and_fifo_per_tenant",
        "tests/gateway/test_gateway_overload.py::test_capacity_dispatches_the_most_important_band_first",
        "tests/sim/test_engine.py::test_priority_scheduling_admits_the_lowest_priority_value_first",
    ),
    "ttft_target_s": (
        "tests/gateway/test_gateway_overload.py::"
        "test_sheddable_requests_are_refused_with_429_at_their_target_and_others_wait_then_503",
        "tests/gateway/test_gateway_overload.py::test_a_sheddable_request_predicted_to_miss_its_target_is_refused_at_once",
        "tests/gateway/test_gateway_overload.py::test_ttft_scorer_weighs_queued_prefill_against_the_prefill_rate",
    ),
    "tpot_target_s": (
        "tests/gateway/test_gateway_routing.py::test_speed_score_is_penalised_past_the_tpot_target_and_zero_when_overloaded",
        "tests/gateway/test_gateway_placement.py::test_batch_spills_onto_an_interactive_worker_only_within_its_tpot_headroom",
        "tests/controller/test_ctl_metrics_names.py::test_tpot_target_is_the_tightest_tier_allowed_on_the_model",
        "tests/controller/test_ctl_policy.py::test_infeasible_target_maximises_per_user_speed_and_flags_overload",
    ),
    "speculation": (
        "tests/gateway/test_gateway_speculation.py::"
        "test_the_gateway_routes_off_to_drafter_free_workers_meters_the_mode_and_refuses_a_forbidden_header",
        "tests/gateway/test_gateway_speculation.py::test_without_the_header_the_mode_is_the_tiers",
    ),
    "prefer": (
        "tests/gateway/test_gateway_routing.py::test_speculation_scorer_by_preference",
        "tests/gateway/test_gateway_routing.py::test_tiers_land_where_the_policy_says_through_the_gateway",
    ),
    "sheddable": (
        "tests/gateway/test_gateway_overload.py::test_a_full_queue_sheds_the_youngest_sheddable_of_the_least_important_band_first",
        "tests/gateway/test_gateway_overload.py::test_a_full_queue_refuses_a_sheddable_arrival_with_429_and_a_vip_with_503",
        "tests/gateway/test_gateway_overload_live.py::"
        "test_overload_sheds_the_sheddable_tier_first_and_loses_or_double_meters_nothing",
    ),
    "brownout_max_tokens": (
        "tests/gateway/test_gateway_overload.py::test_brownout_caps_max_tokens_and_the_reservation",
        "tests/gateway/test_gateway_overload_live.py::test_the_brownout_switch_caps_max_tokens_per_tier",
        "tests/gateway/test_gateway_agentic_estimate.py::test_the_brownout_caps_max_output_tokens_of_a_responses_request",
    ),
}
TIERS_PAGE = ROOT / "docs" / "concepts" / "tiers.md"
TIERS_HEADING = "## What each tier field does"


def test_every_tier_field_has_tests_of_its_effect() -> None:
    assert set(SHOWN_BY) == set(TierConfig.model_fields)


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("field", sorted(SHOWN_BY))
def test_the_named_tests_exist(field: str) -> None:
    for node in SHOWN_BY[field]:
        file, name = node.split("::")
        assert name in _test_names(ROOT / file), f"{field}: {node} is not a test"


def _last_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def reads_tier_field(source: str, field: str) -> bool:
    """True when ``source`` reads ``field`` off a tier: an attribute load ``<receiver>.field`` (parsed, so imports,
    comments and strings never count) whose receiver's last name says it is a tier (``tier``, ``ctx.tier``,
    ``self.principal.tier``, ``lambda tier: tier.field``, ``tenant_tier``); ``entry.priority`` is another record's."""
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == field
        and isinstance(node.ctx, ast.Load)
        and "tier" in _last_name(node.value).lower()
        for node in ast.walk(ast.parse(source))
    )


@pytest.mark.parametrize("field", sorted(SHOWN_BY))
def test_serving_code_reads_the_field(field: str) -> None:
    """Some gateway or controller module reads ``.field`` off a tier (a field read nowhere changes nothing)."""
    readers = [
        path.relative_to(ROOT)
        for package in SERVING
        for path in (ROOT / package).rglob("*.py")
        if reads_tier_field(path.read_text(), field)
    ]
    assert readers, f"{field} is read nowhere in {SERVING}"


UNRELATED = """
from fleet.speculation import FullSpeed  # a module named like a field
import fleet.sheddable
entry.priority + worker.tpot_target_s  # another record's attribute of the same name
\"\"\"tier.brownout_max_tokens in a docstring\"\"\"
# tier.ttft_target_s in a comment
"""


@pytest.mark.parametrize("field", sorted(SHOWN_BY))
def test_the_register_check_fails_for_a_field_read_nowhere(field: str) -> None:
    """Issue 23 defect 8: the check above must not pass on imports, comments, docstrings or other records'
    attributes that share a field's name."""
    assert not reads_tier_field(UNRELATED, field)
    assert reads_tier_field(f"x = ctx.tier.{field}", field)
    assert reads_tier_field(f"pick = lambda tier: tier.{field}", field)


def test_the_docs_table_lists_every_tier_field() -> None:
    text = TIERS_PAGE.read_text()
    assert TIERS_HEADING in text
    section = text.split(TIERS_HEADING, 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)
    assert rows == list(TierConfig.model_fields)
