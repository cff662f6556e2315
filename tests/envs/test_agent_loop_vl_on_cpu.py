"""The VL path of ``hybrid_gui_tool`` (``screenshots=True``): MiniDesk screenshots reach a
vision-language model's input as images.

Everything is real except the inference server: a real MiniDesk episode in Chromium, verl's hermes
tool parser and its Qwen-VL Continuous-Token builder, a real ``Qwen2VLProcessor`` and a tiny
random ``Qwen2VLForConditionalGeneration``, both built locally (nothing is downloaded). The server
is a scripted stand-in that records the ``image_data`` each ``generate`` call receives, as the
text-path tests do (``test_agent_loop_on_cpu.py``).

What the trainer would see is checked with verl's own ``AgentLoopWorker`` post-processing
(``_compute_multi_modal_inputs`` / ``_compute_position_ids``) and a forward of the tiny VL model,
which fails when image placeholder tokens and image features disagree.
"""

from __future__ import annotations

import asyncio
import json
import re
import types
from typing import Any

import pytest

pytestmark = pytest.mark.browser

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Small images: a screenshot of the 1024-pixel-wide page becomes about 12 image tokens.
MAX_PIXELS = 56 * 56 * 4


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    from verl_ext.envs.pool import close_all_pools

    yield
    close_all_pools()


def _vl_chat_template() -> str:
    """The tiny model's ChatML + tool-call template, with list contents whose image parts render
    as Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>`` (one pad; the processor expands it)."""
    from verl_ext.tiny_model import CHAT_TEMPLATE

    macro = (
        "{%- macro render_content(c) -%}{%- if c is string -%}{{- c -}}{%- else -%}"
        "{%- for part in c -%}{%- if part.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
        "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    )
    edits = {"'\\n<tool_response>\\n' + message.content": "'\\n<tool_response>\\n' + render_content(message.content)",
             "{{- message.content }}": "{{- render_content(message.content) }}"}
    template = CHAT_TEMPLATE
    for old, new in edits.items():
        assert template.count(old) == 1, f"tiny_model.CHAT_TEMPLATE changed: {old!r} not found once"
        template = template.replace(old, new)
    return macro + template


@pytest.fixture(scope="module")
def vl() -> types.SimpleNamespace:
    """Tokenizer, processor (with verl's ``get_rope_index`` binding) and a tiny random Qwen2-VL."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers.models.qwen2_vl import Qwen2VLModel
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from verl_ext.tiny_model import build_tokenizer

    class Qwen2VLProcessorWithoutVideo(Qwen2VLProcessor):
        # transformers' video processor needs torchvision, which this machine does not have;
        # no video is ever passed, so the processor is built without one.
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = _vl_chat_template()
    processor = Qwen2VLProcessorWithoutVideo(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=MAX_PIXELS),
        tokenizer=tokenizer, video_processor=None, chat_template=tokenizer.chat_template,
    )
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in VISION_TOKENS}
    config = Qwen2VLConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 4096, "bos_token_id": tokenizer.pad_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
                     # M-RoPE sections (temporal, height, width) add up to head_dim / 2 = 8.
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).eval()
    # What verl's hf_processor does for Qwen2-VL (it cannot load this processor from disk here:
    # AutoProcessor would build the torchvision video processor).
    processor.config = config
    processor.get_rope_index = types.MethodType(Qwen2VLModel.get_rope_index, processor)
    if hasattr(Qwen2VLModel, "get_vision_position_ids"):
        processor.get_vision_position_ids = types.MethodType(Qwen2VLModel.get_vision_position_ids, processor)
    return types.SimpleNamespace(tokenizer=tokenizer, processor=processor, model=model, image_pad=ids["<|image_pad|>"])


class RecordingServer:
    """Stand-in for verl's ``server_manager``: returns the tokens of the next scripted reply (a
    function of the decoded prompt) and records each call's prompt ids, ``image_data`` and reply."""

    def __init__(self, tokenizer: Any, replies: list[Any]):
        self.tokenizer, self.replies, self.calls = tokenizer, list(replies), []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict,
                       image_data: list[Any] | None = None, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "image_data": list(image_data or [])})
        text = self.replies.pop(0)(self.tokenizer.decode(prompt_ids)) + "<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        self.calls[-1]["reply_ids"] = ids
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed",
                           extra_fields={"global_steps": len(self.calls)})


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def click_mail(prompt: str) -> str:
    element = re.search(r'\[(\d+)\] button "Mail"', prompt.rsplit("Page (", 1)[1]).group(1)
    return _call("computer_use", action="click", element=int(element))


def star_sender(prompt: str) -> str:
    return _call("mail_star", sender=re.search(r"Star every email from (.+?)\.", prompt).group(1))


def run_episode(vl: types.SimpleNamespace, server: RecordingServer, layout: str = "trajectory", seed: int = 3):
    """One ``mail_star_sender`` episode with screenshots; the loop is built inside the event loop."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_ext.agent_loops.hybrid_gui_tool import HybridGuiToolAgentLoop

    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 8192, "response_length": 16384,
            "multi_turn": {"max_assistant_turns": 10, "max_tool_response_length": 8000, "format": "hermes"},
        }},
        "data": {},
    })
    prompt = [{"role": "system", "content": "Solve the task with GUI actions or tools."},
              {"role": "user", "content": "Here is your task."}]
    extra_info = {"env": {"backend": "minidesk", "task": "mail_star_sender", "seed": seed}}

    async def episode():
        loop = HybridGuiToolAgentLoop(
            trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=vl.tokenizer,
            processor=vl.processor, dataset_cls=None, data_config=DictConfigWrap(config.data),
            hf_model_type="qwen2_vl", max_envs=1, screenshots=True, layout=layout,
        )
        assert loop.screenshots, "a processor with an image processor must switch screenshots on"
        assert type(loop.continuous_token_builder).__name__ == "QwenVLContinuousTokenBuilder"
        return await loop.run({"temperature": 1.0}, raw_prompt=prompt, extra_info=extra_info)

    return asyncio.run(episode())


def image_runs(token_ids: list[int], vl: types.SimpleNamespace) -> list[int]:
    """Lengths of the runs of ``<|image_pad|>`` tokens (one run per image placeholder)."""
    runs, previous = [], None
    for token in token_ids:
        if token == vl.image_pad:
            if previous == vl.image_pad:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = token
    return runs


def tokens_per_image(vl: types.SimpleNamespace, image: Any) -> int:
    grid = vl.processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"][0]
    return int(grid.prod()) // vl.processor.image_processor.merge_size ** 2


def test_screenshots_reach_the_model_as_images(vl):
    from verl_ext.steps import step_metadata

    server = RecordingServer(vl.tokenizer, [click_mail, star_sender])
    out = run_episode(vl, server)
    meta = step_metadata(out.extra_fields)
    assert meta.valid and meta.extras["success"] is True and meta.num_steps == 2

    # Turn 1 sees the reset screenshot; turn 2 also the one taken after the click.
    first, second = (call["image_data"] for call in server.calls)
    assert len(first) == 1 and len(second) == 2
    assert all(image.mode == "RGB" and image.size == first[0].size and image.width == 1024 for image in second)
    assert second[0].tobytes() == first[0].tobytes()  # the history keeps the first screenshot
    assert second[1].tobytes() != second[0].tobytes()  # the Mail app is open now
    # Each image is one placeholder run in the prompt, as long as the processor makes it.
    for call in server.calls:
        assert image_runs(call["prompt_ids"], vl) == [tokens_per_image(vl, im) for im in call["image_data"]]

    # Token accounting: prompt + response are exactly the last prompt the server saw + its reply.
    assert out.prompt_ids + out.response_ids == server.calls[-1]["prompt_ids"] + server.calls[-1]["reply_ids"]
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert sum(out.response_mask) == sum(end - start for start, end in meta.spans)
    for start, end in meta.spans:
        assert end > start and all(out.response_mask[start:end])
    # The second screenshot came back inside the (masked) tool response, not in a model turn.
    response_pads = [i for i, t in enumerate(out.response_ids) if t == vl.image_pad]
    assert response_pads and not any(out.response_mask[i] for i in response_pads)
    assert image_runs(out.prompt_ids, vl) == [tokens_per_image(vl, first[0])]

    # Step metadata: anchors are the page text (never pixels); weight versions per model token.
    assert all(not a.startswith("sha256:") and "Mail" in a for a in meta.anchor)
    versions = out.extra_fields["token_global_steps"]
    assert len(versions) == len(out.response_mask)
    assert [set(versions[s:e]) for s, e in meta.spans] == [{1}, {2}]


def test_per_turn_rows_each_show_the_current_screenshot(vl):
    from verl_ext.steps import step_metadata

    server = RecordingServer(vl.tokenizer, [click_mail, star_sender])
    outputs = run_episode(vl, server, layout="per_turn", seed=5)
    assert len(outputs) == 2 and all(step_metadata(o.extra_fields).extras["success"] for o in outputs)
    first, second = (call["image_data"] for call in server.calls)
    assert len(first) == len(second) == 1 and first[0].tobytes() != second[0].tobytes()
    for out, call in zip(outputs, server.calls):
        assert out.prompt_ids == call["prompt_ids"]  # the row's prompt is what the model saw
        assert image_runs(out.prompt_ids, vl) == [tokens_per_image(vl, call["image_data"][0])]
        assert vl.image_pad not in out.response_ids and set(out.response_mask) == {1}


def trainer_inputs(vl: types.SimpleNamespace, out: Any) -> dict[str, Any]:
    """What verl's ``AgentLoopWorker`` makes of one output for the trainer: its own
    ``_compute_multi_modal_inputs`` / ``_compute_position_ids`` (unpadded), on a worker view that
    holds only what those methods read."""
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = types.SimpleNamespace(processor=vl.processor, tokenizer=vl.tokenizer, mm_processor_kwargs={})
    worker._get_mm_processor_kwargs = types.MethodType(AgentLoopWorker._get_mm_processor_kwargs, worker)
    input_ids = torch.tensor([out.prompt_ids + out.response_ids])
    attention_mask = torch.ones_like(input_ids)
    mm_inputs = AgentLoopWorker._compute_multi_modal_inputs(worker, out, input_ids)
    position_ids = AgentLoopWorker._compute_position_ids(worker, input_ids, attention_mask, mm_inputs)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, **mm_inputs}


@pytest.mark.parametrize("layout", ["trajectory", "per_turn"])
def test_trainer_gets_pixel_values_for_every_image_token(vl, layout):
    """The trainer recomputes log-probs from ``multi_modal_data``: every image in a row's tokens
    must be there, or the VL forward has image tokens without image features."""
    import torch

    server = RecordingServer(vl.tokenizer, [click_mail, star_sender])
    outputs = run_episode(vl, server, layout=layout, seed=6)
    # trajectory: one row holding every image of the episode; per_turn: one row per call.
    calls = server.calls[-1:] if layout == "trajectory" else server.calls
    for out, call in zip(outputs if layout == "per_turn" else [outputs], calls, strict=True):
        images = (out.multi_modal_data or {}).get("images") or []
        assert [im.tobytes() for im in images] == [im.tobytes() for im in call["image_data"]]
        inputs = trainer_inputs(vl, out)
        assert inputs["image_grid_thw"].shape[0] == len(images)
        n_pads = int((inputs["input_ids"] == vl.image_pad).sum())
        assert n_pads == int(inputs["image_grid_thw"].prod(-1).sum()) // vl.processor.image_processor.merge_size ** 2
        with torch.no_grad():
            logits = vl.model(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                position_ids=inputs["position_ids"].transpose(0, 1),  # (4, 1, L): text + M-RoPE rows, as verl's actor
                pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
            ).logits
        assert logits.shape[1] == inputs["input_ids"].shape[1] and torch.isfinite(logits).all()
