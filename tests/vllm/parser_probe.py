"""Run with ``.venv-vllm``'s python: does vLLM 0.32 accept a launcher command line's tool-call and reasoning flags?

Reads ``{"argv": [...]}`` (the arguments after ``python -m vllm.entrypoints.openai.api_server``) on stdin and
prints ``{"tool_call_parser", "reasoning_parser", "enable_auto_tool_choice", "tool_parsers", "reasoning_parsers",
"tool_parser_class", "reasoning_parser_class"}`` on stdout. Everything is vLLM's own code: its server argument
parser and ``validate_parsed_serve_args`` read the flags, and its parser registries (``ToolParserManager``,
``ReasoningParserManager``) list and load the parsers by name.
"""

from __future__ import annotations

import json
import sys

from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main() -> None:
    argv = json.loads(sys.stdin.read())["argv"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    tool, reasoning = args.tool_call_parser, args.reasoning_parser
    answer = {
        "tool_call_parser": tool,
        "reasoning_parser": reasoning,
        "enable_auto_tool_choice": args.enable_auto_tool_choice,
        "tool_parsers": ToolParserManager.list_registered(),
        "reasoning_parsers": ReasoningParserManager.list_registered(),
        "tool_parser_class": ToolParserManager.get_tool_parser(tool).__name__ if tool else None,
        "reasoning_parser_class": ReasoningParserManager.get_reasoning_parser(reasoning).__name__
        if reasoning
        else None,
    }
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
