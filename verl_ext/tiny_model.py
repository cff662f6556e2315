"""A tiny Qwen2-architecture causal LM with random weights and a locally built tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained with the ``tokenizers``
library on a small built-in corpus, and the model is initialised from a config with a fixed
seed, so the same seed gives bit-identical files on every machine. It exists so verl's real
trainer can run end to end on a CPU in seconds per step; it is not a useful language model.
"""

from __future__ import annotations

import argparse
import json
import os

# ChatML with Qwen2.5-style tool calling: tools are listed in the system turn, assistant tool
# calls are `<tool_call>{json}</tool_call>`, tool results come back as `<tool_response>` in a
# user turn. verl's hermes tool parser reads exactly this format.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for call in message.tool_calls %}{%- set fn = call.function if call.function is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{{- fn.arguments if fn.arguments is string else (fn.arguments | tojson) }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not "special": decoding must keep them so the tool parser sees them.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

_CORPUS = [
    "system user assistant tool tools name arguments content role function type object properties",
    "What is 12 plus 30? The answer is 42. Compute 7 + 5 = 12. 0 1 2 3 4 5 6 7 8 9 10 100",
    'click type scroll press key element id text value button input link checkbox {"name": "click", '
    '"arguments": {"element_id": 3}} {"success": true, "result": null, "error_message": ""}',
    "mail inbox send reply forward subject body to from files folder rename move delete copy",
    "spreadsheet cell row column sum average settings calendar event date time theme dark light",
    "You are a helpful agent. Solve the task using GUI actions or tools. Task: done. Observation:",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
]


def build_tokenizer(vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML + tool-call markup."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.add_tokens(MARKUP_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


# Shapes of real checkpoints (their config.json), for GPU tests and benchmarks with random weights
# of a real architecture. Only the vocabulary differs: the local tokenizer's (a random model that
# samples ids the tokenizer cannot decode would break detokenization, not test anything).
ARCHITECTURES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6),
}


def make_tiny_model(out_dir: str, seed: int = 0, arch: str = "tiny", dtype: str = "float32", **shape: int) -> str:
    """Write a random Qwen2 model + tokenizer to ``out_dir`` and return the path.

    ``arch`` picks the shapes (:data:`ARCHITECTURES`); ``shape`` overrides single config keys
    (``hidden_size=128``). With ``tiny`` the model has about 0.1M parameters and a forward of a
    256-token batch takes milliseconds on one CPU core.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}: use one of {sorted(ARCHITECTURES)}")
    dims = {**ARCHITECTURES[arch], **shape}
    if "hidden_size" in shape and "intermediate_size" not in shape:
        dims["intermediate_size"] = 2 * shape["hidden_size"]
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype,
        **dims,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    ).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "verl_ext_tiny_model.json"), "w") as f:
        json.dump({"seed": seed, "arch": arch, "parameters": sum(p.numel() for p in model.parameters())}, f)
    return out_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verl-ext make-tiny-model", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="tiny",
                        help="shapes of a real checkpoint (random weights, the local tokenizer's vocabulary)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    shape = {}
    if args.arch == "tiny":
        shape = {"hidden_size": args.hidden_size, "num_hidden_layers": args.layers}
    path = make_tiny_model(args.out_dir, seed=args.seed, arch=args.arch, dtype=args.dtype, **shape)
    with open(os.path.join(path, "verl_ext_tiny_model.json")) as f:
        info = json.load(f)
    print(f"tiny model written to {path} ({info['parameters']:,} parameters, seed {args.seed})")
    return 0
