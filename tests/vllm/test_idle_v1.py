"""The idle-drafter skip's per-step shortcuts on vLLM 0.32's V1 runner, checked on vLLM's source and classes.

What the profile of k = 0 named (``workers.vllm.profile_idle``: per step, the skip still ran vLLM's rejection
sampler on zero drafts and ``prepare_next_token_ids_padded``, neither of which a runner without speculation runs):

- a step that verifies no drafts is sampled by the plain sampler (``idle_v1.with_plain_sampler``), which gives
  the rejection sampler's tokens and leaves the generators as it does;
- at k = 0 the skip runs the next-token bookkeeping only under async scheduling, the one case where the next
  step reads it;
- a step at k = 0 builds no ``SpecDecodeMetadata`` (``with_plain_step``);
- the skip's empty proposal is a list, not reported to the scheduler (``no_drafts``, ``with_quiet_take``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from .probes import run_probe
from .test_dspark_masking import function, vllm_source

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROBE = Path(__file__).with_name("idle_v1_probe.py")


@pytest.fixture(scope="module")
def probe(vllm_env: None) -> dict[str, Any]:
    return run_probe(PROBE)


def if_body(tree: ast.AST, test: str) -> list[list[str]]:
    """The bodies (statements, unparsed) of each ``if <test>:`` in ``tree``."""
    return [
        [ast.unparse(b) for b in n.body]
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and ast.unparse(n.test) == test
    ]


def assigned(tree: ast.AST, target: str) -> list[str]:
    """The values assigned to ``target`` anywhere in ``tree`` (annotated or not), in source order."""
    found = []
    for n in ast.walk(tree):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        value = getattr(n, "value", None)
        if value is not None and target in map(ast.unparse, targets):
            found.append((getattr(n, "lineno", 0), ast.unparse(value)))
    return [value for _, value in sorted(found)]


def test_on_zero_drafts_the_rejection_sampler_gives_the_plain_samplers_tokens(probe: dict[str, Any]) -> None:
    """vLLM's own classes: the zero-draft metadata vLLM builds (one logit row per request, at its last token)
    through ``RejectionSampler``, against ``Sampler`` alone, greedy and seeded random."""
    sampler = probe["sampler"]
    assert sampler["max_spec_len"] == 0
    assert sampler["logits_indices"] == [2, 3, 4]
    for mode in ("greedy", "random"):
        assert sampler[mode]["plain"] == sampler[mode]["rejection"]
        assert sampler[mode]["generators_equal"]


def test_a_step_without_drafts_goes_to_the_plain_sampler_and_one_with_drafts_does_not(
    probe: dict[str, Any],
) -> None:
    routing = probe["routing"]
    assert routing["no_drafts"] == {"plain": 1, "rejection": 0, "error": None}
    assert routing["drafts"]["rejection"] == 1
    assert routing["drafts"]["plain"] == 0
    assert routing["no_drafts_logprobs"]["rejection"] == 1  # logprobs: the rejection sampler's own, kept
    assert routing["no_drafts_logprobs"]["plain"] == 0
    assert routing["no_metadata"] == {"plain": 1, "rejection": 0, "error": None}


def test_at_k0_the_skip_runs_the_next_token_bookkeeping_only_under_async_scheduling(probe: dict[str, Any]) -> None:
    skip = probe["skip"]
    assert skip["sync"] == {"calls": [], "drafts": [[], []], "marked": True}
    assert skip["async"] == {
        "calls": ["prepare_next_token_ids_padded", "_copy_valid_sampled_token_count"],
        "drafts": "tensor[2, 0]",  # the runner reads drafts as a tensor under async scheduling
        "marked": False,
    }


def test_v1_samples_through_sample_with_the_metadata_and_uses_the_plain_sampler_without_it() -> None:
    """``with_plain_sampler`` wraps ``_sample(self, logits, spec_decode_metadata)``, which ``sample_tokens``
    calls once, positionally, and which samples with ``self.sampler`` when the metadata is None."""
    runner = vllm_source("v1/worker/gpu_model_runner.py")
    sample = function(runner, "_sample", within="GPUModelRunner")
    assert [a.arg for a in sample.args.args] == ["self", "logits", "spec_decode_metadata"]
    calls = [
        n
        for n in ast.walk(function(runner, "sample_tokens", within="GPUModelRunner"))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self._sample"
    ]
    assert [ast.unparse(c) for c in calls] == ["self._sample(logits, spec_decode_metadata)"]
    assert if_body(sample, "spec_decode_metadata is None") == [
        ["return self.sampler(logits=logits, sampling_metadata=sampling_metadata)"]
    ]


def test_the_rejection_sampler_draws_no_random_numbers_for_a_request_without_drafts() -> None:
    """Why seeded random requests sample the same tokens on either path, now and on every later step."""
    sampler = vllm_source("v1/sample/rejection_sampler.py")
    assert if_body(function(sampler, "generate_uniform_probs"), "n == 0") == [["continue"]]
    assert if_body(function(sampler, "sample_recovered_tokens"), "num_draft_tokens[i] > 0") == [
        ["q[i].exponential_(generator=generator)"]
    ]


def test_v1_reads_the_next_token_bookkeeping_only_under_async_scheduling() -> None:
    """The event exists only with async scheduling (which vLLM's CPU platform turns off), the copy returns at
    once without it, and vLLM's own not-fitting branch skips ``prepare_next_token_ids_padded`` without it."""
    runner = vllm_source("v1/worker/gpu_model_runner.py")
    init = function(runner, "__init__", within="GPUModelRunner")
    assert any(
        "self.valid_sampled_token_count_event = torch.Event()" in b for b in if_body(init, "self.use_async_scheduling")
    )
    assert assigned(runner, "self.valid_sampled_token_count_event") == ["None", "torch.Event()"]  # nowhere else
    copy = function(runner, "_copy_valid_sampled_token_count", within="GPUModelRunner")
    assert ast.unparse(copy.body[0]) == "if self.valid_sampled_token_count_event is None:\n    return"
    sample_tokens = function(runner, "sample_tokens", within="GPUModelRunner")
    guarded = if_body(sample_tokens, "self.valid_sampled_token_count_event is not None")
    assert any("self.drafter.prepare_next_token_ids_padded(" in line for body in guarded for line in body)
    cpu = function(vllm_source("platforms/cpu.py"), "check_and_update_config", within="CpuPlatform")
    assert "scheduler_config.async_scheduling = False" in [ast.unparse(n) for n in ast.walk(cpu)]
    # No other state: the only buffer it writes is rewritten before every read.
    proposer = vllm_source("v1/spec_decode/llm_base_proposer.py")
    prepare = function(proposer, "prepare_next_token_ids_padded", within="SpecDecodeBaseProposer")
    writes = {ast.unparse(t) for n in ast.walk(prepare) if isinstance(n, ast.Assign) for t in n.targets}
    assert {w for w in writes if w.startswith("self.")} == {"self.backup_next_token_ids.np[i]"}

    def uses(tree: ast.AST) -> int:
        return sum(isinstance(n, ast.Attribute) and n.attr == "backup_next_token_ids" for n in ast.walk(tree))

    assert uses(proposer) == uses(prepare) + 1  # and its creation in __init__


def test_model_runner_v2_already_samples_a_step_without_drafts_with_the_plain_sampler() -> None:
    """The same cost does not exist on MRv2: nothing to remove there."""
    sample = ast.unparse(function(vllm_source("v1/worker/gpu/model_runner.py"), "sample", within="GPUModelRunner"))
    assert "elif input_batch.num_draft_tokens == 0 or self.rejection_sampler is None:" in sample
    branch = sample[sample.index("elif input_batch.num_draft_tokens == 0") :]
    assert branch.index("self.sampler(logits, input_batch)") < branch.index("self.rejection_sampler(")


def test_a_step_at_k0_without_drafts_loses_its_metadata_and_keeps_the_logits_rows(probe: dict[str, Any]) -> None:
    steps = probe["plain_step"]
    assert steps["k0"] == {
        "metadata": None,
        "num_draft_tokens": None,
        "logits_indices": [2, 3, 4],
        "flag_left_set": False,
    }
    for kept in ("k0_logprobs", "k0_verifying_the_last_drafts", "k2"):
        assert steps[kept]["metadata"] == "SpecDecodeMetadata", kept
        assert not steps[kept]["flag_left_set"]
    assert steps["k0_verifying_the_last_drafts"]["num_draft_tokens"] == [0, 2, 0]
    assert steps["k2"]["logits_indices"] == steps["k0"]["logits_indices"]


def test_prepare_inputs_reads_only_the_logits_indices_of_the_metadata_and_returns_it() -> None:
    """``with_plain_step_metadata`` hands ``_prepare_inputs`` an object with ``logits_indices`` alone, and
    ``with_plain_step`` replaces it by None in what ``_prepare_inputs`` returns."""
    prepare = function(vllm_source("v1/worker/gpu_model_runner.py"), "_prepare_inputs", within="GPUModelRunner")
    assert [a.arg for a in prepare.args.args][:2] == ["self", "scheduler_output"]
    calls = [ast.unparse(n) for n in ast.walk(prepare) if isinstance(n, ast.Call)]
    assert [c for c in calls if "_calc_spec_decode_metadata" in c] == [
        "self._calc_spec_decode_metadata(num_draft_tokens, cu_num_tokens)"
    ]
    reads = {
        ast.unparse(n)
        for n in ast.walk(prepare)
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "spec_decode_metadata"
    }
    assert reads == {"spec_decode_metadata.logits_indices"}
    (returned,) = [n.value for n in ast.walk(prepare) if isinstance(n, ast.Return) and n.value is not None]
    assert ast.unparse(returned) == "(logits_indices, spec_decode_metadata, int(num_sampled_tokens.max()))"


def test_without_speculation_the_logits_indices_are_what_the_plain_step_computes() -> None:
    """The non-speculative branch's ``query_start_loc[1:] - 1``, with ``query_start_loc`` the runner's buffer on
    the device, copied there before the metadata is built."""
    prepare = function(vllm_source("v1/worker/gpu_model_runner.py"), "_prepare_inputs", within="GPUModelRunner")
    (plain,) = if_body(prepare, "not use_spec_decode")
    assert "logits_indices = query_start_loc[1:] - 1" in plain
    assert "spec_decode_metadata = None" in plain
    assert assigned(prepare, "query_start_loc") == ["self.query_start_loc.gpu[:num_reqs + 1]"]
    text = ast.unparse(prepare)
    assert text.index("self.query_start_loc.copy_to_gpu()") < text.index("self._calc_spec_decode_metadata(")


def test_the_metadata_reaches_only_the_sampler_and_the_proposal() -> None:
    """After ``_prepare_inputs``, ``spec_decode_metadata`` is carried to ``sample_tokens`` and read there only by
    ``_sample`` (the plain sampler without it) and ``propose_draft_token_ids`` (the skip's, on a plain step)."""
    runner = vllm_source("v1/worker/gpu_model_runner.py")

    def loads(name: str) -> list[str]:
        tree = function(runner, name, within="GPUModelRunner")
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        found = []
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and n.id == "spec_decode_metadata" and isinstance(n.ctx, ast.Load):
                parent = parents[n]
                while not isinstance(parent, ast.Call | ast.Tuple):
                    parent = parents[parent]
                found.append(ast.unparse(parent.func) if isinstance(parent, ast.Call) else "tuple")
        return found

    assert loads("execute_model") == ["ExecuteModelState"]
    assert sorted(loads("sample_tokens")) == ["self._sample", "self.propose_draft_token_ids"]
    execute = ast.unparse(function(runner, "execute_model", within="GPUModelRunner"))
    assert execute.index("self._update_states(scheduler_output)") < execute.index("self._prepare_inputs(")
    update = ast.unparse(function(runner, "_update_states", within="GPUModelRunner"))
    assert "self.input_batch.refresh_metadata()" in update  # the sampling metadata the plain step reads is current


def test_the_skips_empty_proposal_is_not_reported_and_a_real_one_is(probe: dict[str, Any]) -> None:
    take = probe["take"]
    assert take["skip"] is None
    assert take["drafts"] == {"req_ids": ["a", "b"], "drafts": [[5, 6], [7]]}
    assert take["skip_then_drafts"] == take["drafts"]


def test_an_unreported_empty_proposal_leaves_the_scheduler_as_the_report_would() -> None:
    """The report sets ``spec_token_ids`` of the requests of the runner's batch; ``schedule()`` has already
    emptied them for every request it scheduled (and the batch holds only those), nothing else gives a request
    drafts, and an empty report validates to ``[]``. The engine does nothing else with the report."""
    scheduler = vllm_source("v1/core/sched/scheduler.py")
    values = {
        ast.unparse(n.value)
        for n in ast.walk(scheduler)
        if isinstance(n, ast.Assign) and "request.spec_token_ids" in map(ast.unparse, n.targets)
    }
    assert values == {"[]", "self.structured_output_manager.validate_tokens(request, spec_token_ids)"}
    schedule = function(scheduler, "schedule", within="Scheduler")
    assert any(body[-1] == "request.spec_token_ids = []" for body in if_body(schedule, "request.spec_token_ids"))
    validate = function(vllm_source("v1/structured_output/__init__.py"), "validate_tokens")
    assert if_body(validate, "not request.use_structured_output") == [["return spec_tokens"]]
    assert if_body(validate, "grammar_start >= len(spec_tokens)") == [["return spec_tokens"]]  # 0 >= 0 for []
    runner = vllm_source("v1/worker/gpu_model_runner.py")
    copy = ast.unparse(function(runner, "_copy_draft_token_ids_to_cpu", within="GPUModelRunner"))
    assert "self._draft_token_req_ids = self.input_batch.req_ids.copy()" in copy
    update = function(runner, "_update_states", within="GPUModelRunner")
    removals = [n for n in ast.walk(update) if isinstance(n, ast.For) and ast.unparse(n.iter) == "unscheduled_req_ids"]
    assert [[ast.unparse(b) for b in n.body] for n in removals] == [["self.input_batch.remove_request(req_id)"]]
    post_step = function(vllm_source("v1/engine/core.py"), "post_step", within="EngineCore")
    assert if_body(post_step, "draft_token_ids is not None") == [
        ["self.scheduler.update_draft_token_ids(draft_token_ids)"]
    ]


def test_without_async_scheduling_the_runner_reads_a_list_of_drafts_as_vllms_ngram_proposer_returns() -> None:
    """Drafts are read as a tensor only by ``_prepare_input_ids`` past its return for a step without previous
    sampled ids on the device (set only under async scheduling), and by the copy, behind ``is_tensor``."""
    runner = vllm_source("v1/worker/gpu_model_runner.py")
    readers = {
        f.name
        for f in ast.walk(runner)
        if isinstance(f, ast.FunctionDef)
        and any(
            ast.unparse(n) in ("self._draft_token_ids", "self.prev_num_spec_tokens")
            for n in ast.walk(f)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
        )
    }
    assert readers == {"_prepare_input_ids", "_copy_draft_token_ids_to_cpu", "_get_draft_token_ids_cpu"}
    prepare = function(runner, "_prepare_input_ids", within="GPUModelRunner")
    (early,) = if_body(prepare, "self.input_batch.prev_sampled_token_ids is None")
    assert early[-1] == "return"
    non_none = {
        ast.unparse(n.value)
        for n in ast.walk(runner)
        if isinstance(n, ast.Assign) and "self.input_batch.prev_sampled_token_ids" in map(ast.unparse, n.targets)
    }
    assert non_none == {"None", "sampled_token_ids", "recv", "next_token_ids.unsqueeze(1)"}
    bookkeeping = function(runner, "_bookkeeping_sync", within="GPUModelRunner")
    (sync_branch,) = [
        n
        for n in ast.walk(bookkeeping)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "not self.use_async_scheduling"
    ]
    async_branch = "\n".join(ast.unparse(b) for b in sync_branch.orelse)
    assert "self.input_batch.prev_sampled_token_ids = sampled_token_ids" in async_branch
    cpu_copy = function(runner, "_get_draft_token_ids_cpu", within="GPUModelRunner")
    assert if_body(cpu_copy, "isinstance(self._draft_token_ids, list)") == [
        ["return (self._draft_token_ids, self.input_batch.req_ids)"]
    ]


ABLATION_PROBE = """
import json, sys
from types import ModuleType, SimpleNamespace
import numpy as np
import torch
from workers.vllm import idle_drafter, idle_v1
from workers.vllm.settings import IdleDrafter

def runner_module():
    module = ModuleType("fake_runner")
    names = ("propose_draft_token_ids", "_sample", "_prepare_inputs", "_calc_spec_decode_metadata",
             "take_draft_token_ids")
    module.GPUModelRunner = type("GPUModelRunner", (), {n: (lambda self, *a: None) for n in names})
    return module

def stand_in(cls):
    runner = cls()
    runner.speculative_config = SimpleNamespace(
        method="draft_model", uses_draft_model=lambda: True, disable_padded_drafter_batch=False)
    runner.drafter = SimpleNamespace()
    runner.input_batch = SimpleNamespace(
        num_reqs=2, req_ids=["a", "b"], num_computed_tokens_cpu=np.array([5, 7], dtype=np.int32))
    runner.valid_sampled_token_count_event = None
    runner.use_async_scheduling = False
    runner.query_start_loc = SimpleNamespace(np=np.array([0, 1, 2], dtype=np.int32))
    runner.input_ids = SimpleNamespace(gpu=torch.arange(8))
    runner._get_positions = lambda n: torch.arange(n)
    runner.device = torch.device("cpu")
    return runner

answer = {}
for mode in (IdleDrafter.SKIP, IdleDrafter.SKIP_NO_CATCH_UP):
    module = runner_module()
    idle_drafter.install(mode, modules={idle_drafter.V1_RUNNER_MODULE: module})
    runner = stand_in(module.GPUModelRunner)
    skip = idle_v1.skip_for(runner)
    out = SimpleNamespace(num_spec_tokens_to_schedule=0, total_num_scheduled_tokens=2)
    skip._skip(runner, out, torch.zeros(2, 1, dtype=torch.int32))
    due = skip.lag.due(["a", "b"], [6, 8])
    answer[mode.value] = {"catch_up": skip.catch_up, "due": [c.length for c in due]}
sys.stdout.write(json.dumps(answer) + "\\n")
"""


def test_the_ablation_installs_the_skip_without_its_catch_up(vllm_env: None, tmp_path: Path) -> None:
    """``GEARSHIFT_IDLE_DRAFTER=skip-no-catch-up``: the same skip at k = 0, but nothing recorded for a catch-up
    (the drafter's KV keeps its hole), so the acceptance check has something that must fail it."""
    script = tmp_path / "ablation_probe.py"
    script.write_text(ABLATION_PROBE)
    answer = run_probe(script)
    assert answer["skip"] == {"catch_up": True, "due": [1, 1]}  # one skipped position per request, replayed
    assert answer["skip-no-catch-up"] == {"catch_up": False, "due": []}
