"""Run with ``.venv-vllm``'s python: what vLLM 0.32's Model Runner V2 would capture for a launcher command line.

Reads ``{"argv": [...]}`` (a launcher's ``vllm serve`` argv) on stdin and prints ``{"full_speed": [[k, from_bs,
to_bs], …], "capture_sizes": [...], "graphs": {mode: count}}`` on stdout. Everything that decides the capture set
is vLLM's own code: its argument parser and ``EngineArgs`` build the ``VllmConfig``; ``VllmConfig
._set_cudagraph_sizes`` sizes the graphs; ``CudaGraphManager`` enumerates the descriptors; ``dispatch`` picks one
per batch (``workers.vllm.internals.decode_full_speed``, the function the GPU worker runs on its real manager).

What cannot exist on a CPU is put back by hand, and only that: the model (the tiny local Llama instead of the
GPU checkpoint: the enumeration reads no model field), tensor parallel 1, the drafter (``ngram``: the
enumeration reads only ``num_speculative_tokens`` and the table, not the method), and the GPU compilation
settings the CPU platform clears (``cudagraph_mode`` FULL_AND_PIECEWISE, vLLM's GPU default, no enforce-eager,
the parsed capture sizes and ceiling, then vLLM's sizing re-run). Model Runner V2 stays off while the config
is built (vLLM refuses it without Triton); it changes no capture sizing there. ``get_pp_group`` is a one-rank
stand-in and the graph pool a placeholder: neither is read by the enumeration.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.worker.gpu import cudagraph_utils

from workers.vllm.internals import decode_full_speed

_DROPPED_FLAGS = {
    "--host": 1,
    "--port": 1,
    "--trust-remote-code": 0,
    "--max-model-len": 1,
    "--enable-prefix-caching": 0,
}
"""Flag → value count: the API server's address, and arguments of the GPU recipe that do not bear on graph
capture and cannot hold for the tiny CPU model."""


class _OneRank:
    is_first_rank = True
    is_last_rank = True


def engine_args(argv: list[str], model: str) -> EngineArgs:
    """vLLM's own parse of the launcher's ``vllm serve MODEL …`` arguments, with the CPU substitutions."""
    rest = list(argv[3:])  # drop "vllm serve MODEL"
    kept: list[str] = []
    i = 0
    while i < len(rest):
        skip = _DROPPED_FLAGS.get(rest[i])
        if skip is None:
            kept.append(rest[i])
            i += 1
        else:
            i += 1 + skip
    # ``vllm serve``'s own parser (it knows the API server's flags too: tool and reasoning parsers, …); the
    # engine's arguments are then taken from it as ``vllm serve`` takes them
    parser = make_arg_parser(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", model, *kept]))
    spec: dict[str, Any] = dict(args.speculative_config or {})
    spec.pop("model", None)
    spec |= {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    args.speculative_config = spec
    args.tensor_parallel_size = 1
    args.max_model_len = 1024
    return args


def probe(argv: list[str], model: str) -> dict[str, Any]:
    args = engine_args(argv, model)
    config = args.create_engine_config()
    compilation = config.compilation_config
    config.model_config.enforce_eager = False
    compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    compilation.cudagraph_capture_sizes = args.cudagraph_capture_sizes
    compilation.max_cudagraph_capture_size = args.max_cudagraph_capture_size
    config._set_cudagraph_sizes()
    cudagraph_utils.get_pp_group = lambda: _OneRank
    type(cudagraph_utils.current_platform)._global_graph_pool = object()
    k_max = config.num_speculative_tokens
    max_num_seqs = config.scheduler_config.max_num_seqs
    manager = cudagraph_utils.CudaGraphManager(
        config, torch.device("cpu"), CUDAGraphMode.FULL_AND_PIECEWISE, decode_query_len=k_max + 1
    )
    manager._graphs_captured = True  # as after capture_model(); dispatch answers NONE before it
    rows = decode_full_speed(manager, k_max=k_max, max_num_seqs=max_num_seqs)
    return {
        "full_speed": None if rows is None else [list(r) for r in rows],
        "capture_sizes": list(compilation.cudagraph_capture_sizes),
        "graphs": {mode.name: len(descs) for mode, descs in manager._capture_descs.items()},
    }


if __name__ == "__main__":
    request = json.load(sys.stdin)
    print(json.dumps(probe(request["argv"], request["model"])))
