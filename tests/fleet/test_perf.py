"""The performance model (fleet.perf): roofline step time, MoE expert activation, drafter cost, acceptance."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from fleet.config import ConfigError
from fleet.perf import (
    Profile,
    StepShape,
    conditional_acceptance,
    expected_tokens_per_step,
    experts_touched,
    kv_capacity_from_memory,
    load_profile,
    state_memory_bytes,
    step_time,
)

DEFAULT = load_profile("kimi-k3-dspark-tp16")
SHIPPED = ("kimi-k3-dspark-tp16", "kimi-k3-dspark-mi355x-tp8", "kimi-k3-dspark-b300-tp8")


def profile_with(**sections: dict[str, Any]) -> Profile:
    data = DEFAULT.model_dump()
    for section, values in sections.items():
        data[section] = {**data[section], **values}
    return Profile.model_validate(data)


def test_one_token_touches_top_r_experts_and_many_tokens_touch_them_all() -> None:
    t = DEFAULT.target
    assert experts_touched(DEFAULT, 0) == 0.0
    assert experts_touched(DEFAULT, 1) == pytest.approx(t.experts_per_token)
    assert experts_touched(DEFAULT, 100_000) == pytest.approx(t.num_experts)
    counts = [experts_touched(DEFAULT, n) for n in range(1, 200)]
    gains = [b - a for a, b in itertools.pairwise(counts)]
    assert all(g > 0 for g in gains), "more tokens always touch more experts"
    assert all(b < a for a, b in itertools.pairwise(gains)), "each extra token adds fewer new experts"


def test_batch_one_decode_step_is_the_roofline_sum() -> None:
    t, hw = DEFAULT.target, DEFAULT.hardware
    shape = StepShape(decode_seqs=1, k=0, context_tokens=1000)
    weights = t.dense_bytes + t.experts_per_token * t.expert_bytes
    kv = 1000 * t.kv_bytes_per_token * t.kv_read_replicas
    state = 2 * t.state_bytes_per_seq  # read once, written once for the one verified token
    expected = (weights + kv + state) / hw.hbm_bytes_per_s + t.comm_s_per_token + t.step_overhead_s
    got = step_time(DEFAULT, shape)
    assert got.target_s == pytest.approx(expected)
    assert got.drafter_s == 0.0
    assert got.total_s == got.target_s


def test_empty_step_costs_nothing() -> None:
    assert step_time(DEFAULT, StepShape(0, 8, 0)).total_s == 0.0


def test_large_prefill_is_compute_bound() -> None:
    p = profile_with(target={"comm_s_per_token": 0.0, "step_overhead_s": 0.0})
    tokens = 1_000_000
    got = step_time(p, StepShape(decode_seqs=0, k=0, context_tokens=0, prefill_tokens=tokens))
    flops_s = 2 * p.target.active_params * tokens / p.hardware.flops_per_s
    assert got.target_s == pytest.approx(flops_s)


def test_kv_reads_grow_linearly_with_context_and_with_replicas() -> None:
    def kv_part(profile: Profile, ctx: int) -> float:
        return step_time(profile, StepShape(1, 0, ctx)).total_s - step_time(profile, StepShape(1, 0, 0)).total_s

    assert kv_part(DEFAULT, 200_000) == pytest.approx(2 * kv_part(DEFAULT, 100_000))
    single = profile_with(target={"kv_read_replicas": 1.0})
    assert kv_part(DEFAULT, 100_000) == pytest.approx(DEFAULT.target.kv_read_replicas * kv_part(single, 100_000))


def test_new_optional_terms_default_to_the_plain_max_roofline() -> None:
    t, hw = DEFAULT.target, DEFAULT.hardware
    assert (t.routed_active_params, t.attention_flops_per_context_token, t.sample_s_per_token) == (0, 0, 0)
    assert (hw.moe_flops_per_s, hw.overlap) == (None, 1.0)


def test_imperfect_overlap_adds_that_share_of_the_shorter_side() -> None:
    shape = StepShape(decode_seqs=64, k=3, context_tokens=64 * 4000, prefill_tokens=2000)
    ideal = profile_with(target={"comm_s_per_token": 0.0, "step_overhead_s": 0.0})
    t, hw = ideal.target, ideal.hardware
    memory = (t.dense_bytes + experts_touched(ideal, 2256) * t.expert_bytes) / hw.hbm_bytes_per_s
    memory += 64 * 4000 * t.kv_bytes_per_token * t.kv_read_replicas / hw.hbm_bytes_per_s
    memory += 64 * (3 + 2) * t.state_bytes_per_seq / hw.hbm_bytes_per_s
    compute = 2 * t.active_params * 2256 / hw.flops_per_s
    for overlap in (1.0, 0.4, 0.0):
        p = profile_with(target={"comm_s_per_token": 0.0, "step_overhead_s": 0.0}, hardware={"overlap": overlap})
        expected = max(memory, compute) + (1 - overlap) * min(memory, compute)
        assert step_time(p, shape).target_s == pytest.approx(expected)


def test_routed_flops_run_at_the_grouped_gemm_rate() -> None:
    routed = 5.6e10
    slow = profile_with(
        target={"comm_s_per_token": 0.0, "step_overhead_s": 0.0, "routed_active_params": routed},
        hardware={"moe_flops_per_s": 1e15},
    )
    tokens = 1_000_000
    got = step_time(slow, StepShape(0, 0, 0, prefill_tokens=tokens)).target_s
    t, hw = slow.target, slow.hardware
    assert got == pytest.approx(2 * tokens * ((t.active_params - routed) / hw.flops_per_s + routed / 1e15))


def test_attention_flops_grow_with_context_and_with_the_verified_tokens() -> None:
    p = profile_with(
        target={"comm_s_per_token": 0.0, "step_overhead_s": 0.0, "attention_flops_per_context_token": 1e9},
        hardware={"overlap": 0.0},
    )

    def attention_s(ctx: int, k: int) -> float:
        return (
            step_time(p, StepShape(1, k, ctx)).target_s
            - step_time(p, StepShape(1, k, 0)).target_s
            - (ctx * p.target.kv_bytes_per_token * p.target.kv_read_replicas / p.hardware.hbm_bytes_per_s)
        )

    assert attention_s(10_000, 0) == pytest.approx(1e9 * 10_000 / p.hardware.flops_per_s)
    assert attention_s(20_000, 0) == pytest.approx(2 * attention_s(10_000, 0))
    assert attention_s(10_000, 3) == pytest.approx(4 * attention_s(10_000, 0))


def test_sampling_is_paid_per_verified_token_not_per_prefill_token() -> None:
    p = profile_with(target={"sample_s_per_token": 1e-5})

    def extra(shape: StepShape) -> float:
        return step_time(p, shape).target_s - step_time(DEFAULT, shape).target_s

    assert extra(StepShape(10, 3, 10_000)) == pytest.approx(40 * 1e-5)
    assert extra(StepShape(0, 0, 0, prefill_tokens=5000)) == 0.0


def test_drafter_is_nearly_flat_in_k_and_absent_without_speculation() -> None:
    drafter = [step_time(DEFAULT, StepShape(1, k, 2000)).drafter_s for k in range(9)]
    assert drafter[0] == 0.0
    assert drafter[8] > drafter[1] > 0
    assert drafter[8] < 1.2 * drafter[1], "one block-parallel pass proposes every position"


def test_speculation_helps_a_lot_alone_and_hurts_with_a_full_batch() -> None:
    maths = conditional_acceptance(DEFAULT, "maths", 2000)

    def gain(batch: int, k: int) -> float:
        def rate(kk: int) -> float:
            shape = StepShape(batch, kk, batch * 2000)
            return expected_tokens_per_step(maths, kk) / step_time(DEFAULT, shape).total_s

        return rate(k) / rate(0)

    k = DEFAULT.drafter.k_max
    assert gain(1, k) > 3.0
    assert gain(1, k) > gain(16, k) > 1.0
    random = conditional_acceptance(DEFAULT, "random", 2000)
    full = StepShape(256, k, 256 * 2000)
    assert (
        expected_tokens_per_step(random, k) / step_time(DEFAULT, full).total_s
        < 1 / step_time(DEFAULT, StepShape(256, 0, 256 * 2000)).total_s
    )


def test_acceptance_rises_with_context_up_to_the_reference_length() -> None:
    cls = DEFAULT.acceptance["long-context"]
    short = conditional_acceptance(DEFAULT, "long-context", 0)
    mid = conditional_acceptance(DEFAULT, "long-context", 50_000)
    ref = conditional_acceptance(DEFAULT, "long-context", cls.context_ref)
    beyond = conditional_acceptance(DEFAULT, "long-context", 10 * cls.context_ref)
    assert short == pytest.approx(cls.base)
    assert all(a < b < c for a, b, c in zip(short, mid, ref, strict=True))
    assert beyond == pytest.approx(ref)
    assert ref[0] == pytest.approx(1 - (1 - cls.base[0]) * (1 - cls.context_gain))


def test_acceptance_has_k_max_positions_and_unknown_workloads_use_the_default() -> None:
    assert len(conditional_acceptance(DEFAULT, "maths", 0)) == DEFAULT.drafter.k_max
    assert conditional_acceptance(DEFAULT, "no-such-class", 123) == conditional_acceptance(
        DEFAULT, DEFAULT.default_workload, 123
    )
    short = profile_with(acceptance={"chat": {"base": (0.5, 0.4)}})
    assert conditional_acceptance(short, "chat", 0) == (0.5,) + (0.4,) * (DEFAULT.drafter.k_max - 1)


def test_expected_tokens_per_step_counts_the_bonus_token() -> None:
    assert expected_tokens_per_step((0.9,) * 8, 0) == 1.0
    assert expected_tokens_per_step((1.0,) * 8, 8) == 9.0
    assert expected_tokens_per_step((0.5, 0.5), 2) == pytest.approx(1 + 0.5 + 0.25)
    probs = conditional_acceptance(DEFAULT, "code", 1000)
    values = [expected_tokens_per_step(probs, k) for k in range(9)]
    assert values == sorted(values)


def test_load_profile_by_path_and_bad_profiles_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(DEFAULT.model_dump_json())
    assert load_profile(path) == DEFAULT
    data = DEFAULT.model_dump()
    data["acceptance"]["chat"]["base"] = [0.5, 1.5]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"acceptance\.chat\.base"):
        load_profile(path)


def test_constant_state_is_read_once_and_written_per_verified_token() -> None:
    stateless = profile_with(target={"state_bytes_per_seq": 0.0})

    def state_s(seqs: int, k: int) -> float:
        shape = StepShape(seqs, k, seqs * 1000)
        return step_time(DEFAULT, shape).target_s - step_time(stateless, shape).target_s

    per_copy = DEFAULT.target.state_bytes_per_seq / DEFAULT.hardware.hbm_bytes_per_s
    assert state_s(1, 0) == pytest.approx(2 * per_copy)
    assert state_s(1, 7) == pytest.approx(9 * per_copy)
    assert state_s(32, 7) == pytest.approx(32 * state_s(1, 7)), "constant per request, whatever its context"
    assert step_time(DEFAULT, StepShape(0, 0, 0, prefill_tokens=1000)).target_s == pytest.approx(
        step_time(stateless, StepShape(0, 0, 0, prefill_tokens=1000)).target_s
    )


def test_verification_cost_is_paid_only_by_speculative_steps() -> None:
    p = profile_with(target={"verify_s_per_token": 1e-4})

    def extra(shape: StepShape) -> float:
        return step_time(p, shape).target_s - step_time(DEFAULT, shape).target_s

    assert extra(StepShape(8, 7, 8000)) == pytest.approx(64 * 1e-4)
    assert extra(StepShape(8, 0, 8000)) == 0.0


@pytest.mark.parametrize("name", SHIPPED)
def test_kv_capacity_is_what_memory_holds_after_weights_activations_and_state(name: str) -> None:
    profile = load_profile(name)
    assert profile.hardware.kv_capacity_tokens == kv_capacity_from_memory(profile)
    assert state_memory_bytes(profile, 1) == (1 + profile.drafter.k_max) * profile.target.state_bytes_per_seq
    fewer = profile.model_copy(update={"serving": profile.serving.model_copy(update={"max_num_seqs": 1})})
    assert kv_capacity_from_memory(fewer) > kv_capacity_from_memory(profile), "state takes KV room"


def test_memory_that_does_not_fit_leaves_no_kv() -> None:
    tiny = profile_with(hardware={"hbm_capacity_bytes_per_gpu": 1e9})
    assert kv_capacity_from_memory(tiny) == 0


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_state_their_hardware_and_recipe(name: str) -> None:
    profile = load_profile(name)
    assert profile.hardware.gpus == profile.serving.tensor_parallel_size
    assert profile.drafter.k_max == 7, "the recipe's num_speculative_tokens"
    assert profile.serving.max_model_len == 1_048_576
    assert (profile.target.num_experts, profile.target.experts_per_token) == (896, 16)
    assert profile.figures is not None


def test_serving_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        profile_with(serving={"tensor_parallel_size": 3})
    with pytest.raises(ValueError, match="max_num_seqs"):
        profile_with(serving={"max_num_seqs": 0})
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        profile_with(serving={"kv_cache_dtype": "int3"})
    with pytest.raises(ValueError, match="default_workload"):
        Profile.model_validate({**DEFAULT.model_dump(), "default_workload": "no-such-class"})
