"""Build a tiny tokenizer and a random-weight Llama on local disk, for the CPU engine in tests and measurements.

No hub access: the tokenizer is a byte-level BPE trained here on a few lines of text, the model is a
``LlamaForCausalLM`` with seeded random weights. Decoded greedily such a model soon repeats itself, which
makes ``ngram`` drafts almost always accepted; sampled with temperature > 0 it almost never is.

Run with the vLLM virtualenv (it needs ``torch``, ``transformers`` and ``tokenizers``)::

    .venv-vllm/bin/python -m workers.vllm.tiny_model /tmp/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

_CORPUS = (
    "the quick brown fox jumps over the lazy dog. ",
    "speculative decoding drafts a few tokens and the target model verifies them in one step. ",
    "gearshift shifts the speculation length of each worker as the load changes. ",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?-_()[]{}'\"/\\@#$%^&*+=<>|~`",
)
_SPECIALS = ("<s>", "</s>", "<unk>")
_STAMP = "gearshift-tiny-model.json"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model. Sizes in tokens (vocab, context) and units of the Llama config."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    """head_dim = hidden_size / num_attention_heads = 64: vLLM's CPU attention kernels reject small head sizes."""
    max_position_embeddings: int = 2048
    seed: int = 0


def build_tiny_model(out: Path, spec: TinyModelSpec | None = None) -> Path:
    """Write tokenizer + config + safetensors weights into ``out``; a no-op when ``out`` already holds ``spec``."""
    spec = spec or TinyModelSpec()
    stamp = out / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == asdict(spec):
        return out
    # Build beside ``out`` and move into place, so a reader never sees half a model.
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        work = Path(tmp)
        bos, eos = _build_tokenizer(work, spec)
        _build_model(work, spec, bos=bos, eos=eos)
        (work / _STAMP).write_text(json.dumps(asdict(spec)))
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
        work.mkdir()  # TemporaryDirectory removes what it created
    return out


def _build_tokenizer(out: Path, spec: TinyModelSpec) -> tuple[int, int]:
    """Train a byte-level BPE tokenizer on the tiny corpus and save it into ``out``; returns its (bos, eos) ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=spec.max_position_embeddings,
    )
    # A chat template so /v1/chat/completions works too: plain role-prefixed lines.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(str(out))
    return int(fast.bos_token_id), int(fast.eos_token_id)


def _build_model(out: Path, spec: TinyModelSpec, *, bos: int, eos: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into (reused when up to date)")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out))


if __name__ == "__main__":
    main()
