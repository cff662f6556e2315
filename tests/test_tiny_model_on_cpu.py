"""The tiny-model factory: deterministic, local, and speaks the tool-call format verl parses; its
Qwen2.5-VL build loads and runs as verl loads a vision-language checkpoint."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer
from verl.experimental.agent_loop.tool_parser import HermesToolParser

from verl_ext.tiny_model import VISION_TOKENS, build_tokenizer, make_tiny_model, mrope_section


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_files_other_seed_other_weights(tiny_model_dir, tmp_path):
    again = Path(make_tiny_model(str(tmp_path / "again"), seed=0))
    other = Path(make_tiny_model(str(tmp_path / "other"), seed=1))
    base = Path(tiny_model_dir)
    assert _digest(base / "model.safetensors") == _digest(again / "model.safetensors")
    assert _digest(base / "tokenizer.json") == _digest(again / "tokenizer.json")
    assert _digest(base / "model.safetensors") != _digest(other / "model.safetensors")


def test_chat_template_round_trips_tool_calls_through_verls_parser(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "click", "description": "click an element",
              "parameters": {"type": "object", "properties": {"element_id": {"type": "integer"}}}}}]
    messages = [
        {"role": "user", "content": "Open the inbox."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "click", "arguments": {"element_id": 3}}}]},
        {"role": "tool", "content": '{"success": true}'},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"name": "click"' in text and "<tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    # The assistant turn, as the model would emit it, parses into the same call.
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    ids = tok(assistant)["input_ids"]
    assert tok.decode(ids) == assistant  # markup tokens survive decoding
    content, calls = asyncio.run(HermesToolParser(tok).extract_tool_calls(ids))
    assert [(c.name, c.arguments) for c in calls] == [("click", '{"element_id": 3}')]


def test_eos_is_the_chat_end_token(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


# --- Qwen2.5-VL: the architecture of recipes/toolcua_hybrid/run_*_qwen25vl_7b.sh, scaled down ---------
# Every shape except the widths and depths is Qwen2.5-VL-7B's (patch 14, 2x2 merge, window attention
# with full-attention blocks, M-RoPE, the published image pixel range).
SMALL_VL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, fullatt_block_indexes=[1]))
TOOLS = [{"type": "function", "function": {"name": "click", "description": "click an element",
          "parameters": {"type": "object", "properties": {"element_id": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def small_vl_dir(tmp_path_factory) -> str:
    return make_tiny_model(str(tmp_path_factory.mktemp("small_vl")), seed=0, arch="qwen2.5-vl-7b", **SMALL_VL)


def _processor(model_dir: str):
    """The processor verl's rollout and trainer use. With torchvision (the GPU machine) it is verl's
    own ``hf_processor`` (AutoProcessor + verl's rope-index binding). transformers builds the
    Qwen2.5-VL video processor only with torchvision, which this CPU venv lacks (torch's CPU build
    has no matching torchvision wheel here): then the processor is put together from the folder's
    tokenizer, chat template and image processor (its PIL implementation), without a video processor
    (no video is passed)."""
    if importlib.util.find_spec("torchvision") is not None:
        from verl.utils.tokenizer import hf_processor

        processor = hf_processor(model_dir)
        assert processor is not None, f"AutoProcessor.from_pretrained({model_dir}) failed (verl swallows the error)"
        return processor
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class WithoutVideo(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return WithoutVideo(image_processor=Qwen2VLImageProcessorPil.from_pretrained(model_dir), tokenizer=tokenizer,
                        video_processor=None, chat_template=tokenizer.chat_template)


def test_mrope_section_is_qwen25vls_split():
    assert mrope_section(128) == [16, 24, 24]  # Qwen2.5-VL-7B's config.json
    assert sum(mrope_section(16)) == 8


def test_vl_template_renders_text_contents_as_the_text_template():
    text, vision = build_tokenizer(), build_tokenizer(vision=True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Open the inbox."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "click", "arguments": {"element_id": 3}}}]},
                {"role": "tool", "content": '{"success": true}'}]
    assert (vision.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
            == text.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True))
    assert len(text) == 516 and len(vision) == 516 + len(VISION_TOKENS)  # text models' vocabulary unchanged


def test_vl_model_loads_processes_a_screenshot_and_runs(small_vl_dir):
    """What the VL scripts need from the folder: config, processor, a screenshot prompt through
    verl's Qwen-VL Continuous-Token builder (as ``hybrid_gui_tool`` builds it), a forward pass."""
    import torch
    from PIL import Image
    from transformers import AutoConfig, AutoModelForImageTextToText
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    config = AutoConfig.from_pretrained(small_vl_dir)
    processor = _processor(small_vl_dir)
    tokenizer = processor.tokenizer
    assert config.model_type == "qwen2_5_vl"
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]

    screenshot = Image.new("RGB", (1024, 768), "white")  # MiniDesk's viewport
    messages = [{"role": "system", "content": "You are a computer-use agent."},
                {"role": "user", "content": [{"type": "image", "image": screenshot},
                                             {"type": "text", "text": "Task: open the inbox."}]}]
    text = processor.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<|vision_start|><|image_pad|><|vision_end|>Task: open the inbox." in text and '"name": "click"' in text
    inputs = processor(text=[text], images=[screenshot], return_tensors="pt")
    grid = inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 54, 74]]  # 756x1036 after resizing to 28-pixel multiples
    image_tokens = int((inputs["input_ids"] == config.image_token_id).sum())
    assert image_tokens == 999 and inputs["pixel_values"].shape[0] == 54 * 74

    builder = create_continuous_token_builder(tokenizer, hf_model_type=config.model_type, processor=processor)
    assert type(builder).__name__ == "QwenVLContinuousTokenBuilder"
    assert builder.build_initial_tokens(messages, tools=TOOLS, images=[screenshot]) == inputs["input_ids"][0].tolist()

    model = AutoModelForImageTextToText.from_pretrained(small_vl_dir).eval()
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(tokenizer)) and torch.isfinite(logits).all()


def test_a_tokenizer_learnt_from_transcripts_spells_new_ones_in_fewer_tokens_and_round_trips(tmp_path):
    """``--vocab-size`` + ``--tokenizer-corpus``: merges learnt from text_hybrid transcripts of training tasks
    shorten transcripts of held-out tasks (the SFT stage's sequences) and still decode to the same text."""
    import pandas as pd

    from verl_ext.datasets.demos import text_hybrid_sft_rows
    from verl_ext.tiny_model import transcript_corpus

    corpus_file = tmp_path / "corpus.parquet"
    pd.DataFrame(text_hybrid_sft_rows(24, 0, "train", ["settings_panel"])).to_parquet(corpus_file)
    held_out = tmp_path / "held_out.parquet"
    pd.DataFrame(text_hybrid_sft_rows(4, 0, "val", ["settings_panel"])).to_parquet(held_out)
    texts = transcript_corpus(str(held_out))
    default, learnt = build_tokenizer(), build_tokenizer(2048, corpus=transcript_corpus(str(corpus_file)))
    lengths = [(len(default(t)["input_ids"]), len(learnt(t)["input_ids"])) for t in texts]
    assert all(new < 0.75 * old for old, new in lengths), lengths
    assert all(learnt.decode(learnt(t)["input_ids"]) == t for t in texts)
