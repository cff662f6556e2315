"""A tiny Qwen2-architecture causal LM with random weights and a locally built tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained with the ``tokenizers``
library on a small built-in corpus, and the model is initialised from a config with a fixed
seed, so the same seed gives bit-identical files on every machine. It exists so verl's real
trainer can run end to end on a CPU in seconds per step; it is not a useful language model.

The same factory builds random weights of real architectures (:data:`ARCHITECTURES`) for GPU
runs and benchmarks, Qwen2.5-VL included: then the folder also holds what verl and vLLM load a
vision-language checkpoint with (Qwen's vision tokens, a chat template that renders images,
``preprocessor_config.json`` for ``AutoProcessor``).
"""

from __future__ import annotations

import json
import os
import re

from verl_ext.cli_args import command_parser, positive_int

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
# Qwen2.5-VL's vision tokens (vision models only, added after the others so a text model's
# vocabulary is unchanged). The processor expands each <|image_pad|> to one token per merged patch.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]

# The same template for vision models, with list contents (verl's and OpenAI's
# ``[{"type": "image"}, {"type": "text", "text": ...}]``) rendered as Qwen2.5-VL renders them.
_RENDER_CONTENT = (
    "{%- macro render_content(content) %}"
    "{%- if content is string %}{{- content }}"
    "{%- else %}{%- for part in content %}"
    "{%- if part.type == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part.type == 'video' or 'video' in part %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}{{- part.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- endmacro %}"
)
VL_CHAT_TEMPLATE = _RENDER_CONTENT + re.sub(r"\b(messages\[0\]|message)\.content\b", r"render_content(\1.content)",
                                            CHAT_TEMPLATE)

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


def build_tokenizer(vocab_size: int = 512, vision: bool = False, corpus: list[str] | None = None):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML + tool-call markup (+ Qwen2.5-VL's
    vision tokens and image-rendering chat template with ``vision``).

    BPE merges are learnt from a small built-in text, plus ``corpus`` when given: texts like the ones
    the model will read (``transcript_corpus``), so that with a larger ``vocab_size`` a transcript takes
    fewer tokens (text_hybrid transcripts: ~4.6k tokens with the default 512, ~2.3k with 2048 learnt on
    1,000 of them)."""
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
    tok.train_from_iterator(_CORPUS * 4 + list(corpus or []), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.add_tokens(MARKUP_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    if vision:
        fast.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
        fast.chat_template = VL_CHAT_TEMPLATE
    return fast


def transcript_corpus(path: str) -> list[str]:
    """Texts to learn a tokenizer's merges from: each row of a parquet of chat transcripts (``messages``
    and ``tools`` as JSON text or lists, as ``verl-ext prepare-data text_hybrid_sft`` writes them)
    rendered with the chat template the model will see, or each line of a text file."""
    if not path.endswith(".parquet"):
        with open(path, encoding="utf-8") as f:
            return [line for line in f if line.strip()]
    import pandas as pd

    frame = pd.read_parquet(path)
    if "messages" not in frame.columns:
        raise ValueError(f"{path}: no 'messages' column; give chat transcripts (verl-ext prepare-data "
                         "text_hybrid_sft) or a text file")
    template = build_tokenizer()

    def decoded(value):
        return json.loads(value) if isinstance(value, str) else value

    return [template.apply_chat_template(decoded(row["messages"]), tools=decoded(row.get("tools")) or None,
                                         tokenize=False) for row in frame.to_dict("records")]


# Shapes of real checkpoints (their config.json), for GPU tests and benchmarks with random weights
# of a real architecture. Only the vocabulary differs: the local tokenizer's (a random model that
# samples ids the tokenizer cannot decode would break detokenization, not test anything).
ARCHITECTURES: dict[str, dict] = {
    # 32768 positions: vLLM refuses prompts beyond max_position_embeddings, and the ToolCUA decision
    # prompts run past 4k tokens (RoPE's numbers do not depend on it: HF's forward is unchanged)
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=32768),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, max_position_embeddings=32768, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=False),
    # Qwen2.5-VL-7B-Instruct: Qwen2.5-7B's language model (128k positions, M-RoPE) + a 32-block ViT
    # whose patch merger projects 2x2 patches into the language model's width.
    "qwen2.5-vl-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                          num_key_value_heads=4, max_position_embeddings=128000, rope_theta=1000000.0,
                          rms_norm_eps=1e-6, tie_word_embeddings=False,
                          vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                                      fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)),
}
# Qwen2.5-VL-7B-Instruct's preprocessor_config.json: an image becomes 4 to 16384 merged 28x28
# patches, one token each (a 1024x768 screenshot: 999 tokens).
VL_PIXELS = dict(min_pixels=3136, max_pixels=12845056)


def mrope_section(head_dim: int) -> list[int]:
    """M-RoPE's (temporal, height, width) split of a head's ``head_dim / 2`` rotary frequencies in
    Qwen2.5-VL's proportions 1/4, 3/8, 3/8 (``[16, 24, 24]`` for its head_dim of 128)."""
    half = head_dim // 2
    temporal = half // 4
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def make_tiny_model(out_dir: str, seed: int = 0, arch: str = "tiny", dtype: str = "float32", device: str = "cpu",
                    vision: dict | None = None, vocab_size: int = 512, tokenizer_corpus: str | None = None,
                    **shape: int) -> str:
    """Write a random Qwen2 (or Qwen2.5-VL) model + tokenizer to ``out_dir`` and return the path.

    ``arch`` picks the shapes (:data:`ARCHITECTURES`); ``shape`` overrides single config keys of the
    language model (``hidden_size=128``), ``vision`` keys of a VL arch's vision tower (``{"depth": 2}``);
    ``vocab_size`` and ``tokenizer_corpus`` (:func:`transcript_corpus`) the tokenizer's (:func:`build_tokenizer`).
    With ``tiny`` the model has about 0.1M parameters and a forward of a 256-token batch takes
    milliseconds on one CPU core. The weights are initialised in ``dtype`` on ``device``: ``cuda``
    builds a 7B model in seconds, and the same seed gives the same files on the same kind of device.
    """
    import torch
    from transformers import GenerationConfig

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}: use one of {sorted(ARCHITECTURES)}")
    dims = {**ARCHITECTURES[arch], **shape}
    if "hidden_size" in shape and "intermediate_size" not in shape:
        dims["intermediate_size"] = 2 * shape["hidden_size"]
    vision_dims = dims.pop("vision", None)
    if vision is not None:
        if vision_dims is None:
            raise ValueError(f"arch {arch!r} has no vision tower, so vision={vision} cannot apply: use one of "
                             f"{sorted(name for name, a in ARCHITECTURES.items() if 'vision' in a)}")
        vision_dims = {**vision_dims, **vision}
    corpus = transcript_corpus(tokenizer_corpus) if tokenizer_corpus else None
    tokenizer = build_tokenizer(vocab_size, vision=vision_dims is not None, corpus=corpus)
    text = {"vocab_size": len(tokenizer), "tie_word_embeddings": True,
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"), "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id, **dims}
    torch.manual_seed(seed)
    with torch.device(device):
        if vision_dims is None:
            model = _causal_lm(text, getattr(torch, dtype))
        else:
            model = _vision_language_model(text, vision_dims, tokenizer, getattr(torch, dtype))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    ).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if vision_dims is not None:
        _save_image_processor(out_dir, vision_dims)
    with open(os.path.join(out_dir, "verl_ext_tiny_model.json"), "w") as f:
        json.dump({"seed": seed, "arch": arch, "parameters": sum(p.numel() for p in model.parameters())}, f)
    return out_dir


def _causal_lm(text: dict, dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM._from_config(Qwen2Config(torch_dtype=dtype, **text), dtype=dtype)


def _vision_language_model(text: dict, vision: dict, tokenizer, dtype):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    text = dict(text)
    rope = {"rope_type": "default", "rope_theta": text.pop("rope_theta", 1000000.0),
            "mrope_section": mrope_section(text["hidden_size"] // text["num_attention_heads"])}
    config = Qwen2_5_VLConfig(
        text_config={**text, "rope_parameters": rope},
        vision_config={**vision, "out_hidden_size": text["hidden_size"]},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=text["tie_word_embeddings"], torch_dtype=dtype,
    )
    return Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)


def _save_image_processor(out_dir: str, vision: dict) -> None:
    """``preprocessor_config.json`` as the published Qwen2.5-VL checkpoints have it. AutoProcessor
    finds ``Qwen2_5_VLProcessor`` there and builds its video processor from the same file."""
    # the PIL implementation saves the same config as the torchvision one, and needs no torchvision
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(patch_size=vision["patch_size"], temporal_patch_size=vision["temporal_patch_size"],
                             merge_size=vision["spatial_merge_size"], **VL_PIXELS).save_pretrained(out_dir)
    path = os.path.join(out_dir, "preprocessor_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "processor_class": "Qwen2_5_VLProcessor"}, f, indent=2)


def main(argv: list[str]) -> int:
    parser = command_parser("verl-ext make-tiny-model", __doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder for the model, its tokenizer and config")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument("--hidden-size", type=int, default=64, help="--arch tiny only")
    parser.add_argument("--layers", type=int, default=2, help="--arch tiny only")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="tiny",
                        help="shapes of a real checkpoint (random weights, the local tokenizer's vocabulary)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weight dtype")
    parser.add_argument("--device", default="cpu", help="where the weights are initialised (cuda: fast for 7B)")
    parser.add_argument("--vocab-size", type=positive_int, default=512,
                        help="the tokenizer's BPE vocabulary (learnt merges + the byte alphabet and markup)")
    parser.add_argument("--tokenizer-corpus", metavar="PATH",
                        help="texts to learn the merges from as well: a parquet of chat transcripts (verl-ext "
                        "prepare-data text_hybrid_sft) or a text file; shorter token sequences for that text")
    args = parser.parse_args(argv)
    if args.tokenizer_corpus and not os.path.exists(args.tokenizer_corpus):
        parser.error(f"--tokenizer-corpus {args.tokenizer_corpus}: no such file")
    shape = {}
    if args.arch == "tiny":
        shape = {"hidden_size": args.hidden_size, "num_hidden_layers": args.layers}
    path = make_tiny_model(args.out_dir, seed=args.seed, arch=args.arch, dtype=args.dtype, device=args.device,
                           vocab_size=args.vocab_size, tokenizer_corpus=args.tokenizer_corpus, **shape)
    with open(os.path.join(path, "verl_ext_tiny_model.json")) as f:
        info = json.load(f)
    print(f"tiny model written to {path} ({info['parameters']:,} parameters, seed {args.seed})")
    return 0
