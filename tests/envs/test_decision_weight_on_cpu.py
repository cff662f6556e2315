"""SFT_DECISION_WEIGHT: ``DecisionWeightedSFTDataset`` puts the weight W in verl's
``loss_mask`` at each assistant call's decision tokens (the function name's tokens through the one
where it parts from the other way's names: an app tool's from ``computer_use``, ``computer_use``'s
from every app tool offered) and leaves the mask of verl's own dataset everywhere else; W = 1 is
verl's mask, values and dtype. Checked on real transcripts of the ``text_hybrid_sft`` builder,
tokenised by the tiny model's tokenizer, against ``JsonMultiTurnSFTDataset``'s mask; and the
weighted mask goes through verl's own ``sft_loss`` as a weighted token mean."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from verl_ext.data import write_parquet
from verl_ext.envs.core import GUI_TOOL_NAME
from verl_ext.datasets.demos import DecisionWeightedSFTDataset, JsonMultiTurnSFTDataset, text_hybrid_sft_rows
from verl_ext.errors import UserError


def _config(**extra) -> OmegaConf:
    return OmegaConf.create({"messages_key": "messages", "tools_key": "tools", "max_length": 32768,
                             "truncation": "error", "pad_mode": "no_padding", **extra})


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    # all four apps: their tools' names part from computer_use at the first piece or later (contacts_*)
    return text_hybrid_sft_rows(6, seed=0, split="train",
                                templates=["settings_panel", "contacts_book", "file_manager", "inventory_sheet"])


@pytest.fixture(scope="module")
def setup(rows, tiny_model_dir, tmp_path_factory):
    path = write_parquet(rows, str(tmp_path_factory.mktemp("sft") / "train.parquet"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return path, tokenizer, JsonMultiTurnSFTDataset([path], tokenizer, _config())


def _runs(positions: list[int]) -> list[list[int]]:
    """Consecutive runs of sorted positions."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def test_weighted_mask_is_w_exactly_at_the_decision_tokens(rows, setup):
    path, tokenizer, plain = setup
    weight = 8
    weighted = DecisionWeightedSFTDataset([path], tokenizer, _config(decision_weight=weight))
    later_than_first_piece = tool_turns = 0
    for index, row in enumerate(rows):
        base, item = plain[index], weighted[index]
        ids = item["input_ids"].tolist()
        assert ids == base["input_ids"].tolist()
        mask, base_mask = item["loss_mask"], base["loss_mask"]
        assert mask.dtype == torch.float32 and base_mask.dtype == torch.int64
        at_w = (mask == weight).nonzero().flatten().tolist()
        changed = (mask != base_mask.to(torch.float32)).nonzero().flatten().tolist()
        assert changed == at_w and bool((base_mask[at_w] == 1).all())  # elsewhere: verl's mask, unchanged
        offered = [t["function"]["name"] for t in json.loads(row["tools"])]
        calls = [m["tool_calls"][0]["function"]["name"] for m in json.loads(row["messages"]) if m["role"] == "assistant"]
        runs = _runs(at_w)
        assert len(runs) == len(calls)
        tool_turns += sum(name != GUI_TOOL_NAME for name in calls)
        for run, name in zip(runs, calls):
            others = [GUI_TOOL_NAME] if name != GUI_TOOL_NAME else [n for n in offered if n != GUI_TOOL_NAME]
            before = tokenizer.decode(ids[:run[0]])
            written = tokenizer.decode(ids[run[0]:run[-1] + 1])
            shorter = tokenizer.decode(ids[run[0]:run[-1]])
            assert before.endswith('{"name": "')  # the run starts the function name of the call
            assert name.startswith(written)  # and stays inside it,
            assert not any(o.startswith(written) for o in others)  # ends where the other way's names part,
            assert not run[:-1] or any(o.startswith(shorter) for o in others)  # and not a token later
            later_than_first_piece += len(run) > 1
    assert tool_turns and later_than_first_piece  # some names share a first piece with the other way (computer_use / contacts_*)


@pytest.mark.parametrize("extra", [{}, {"decision_weight": 1}, {"decision_weight": 1.0}])
def test_weight_one_is_verls_mask(rows, setup, extra):
    path, tokenizer, plain = setup
    weighted = DecisionWeightedSFTDataset([path], tokenizer, _config(**extra))
    for index in range(len(rows)):
        base, item = plain[index], weighted[index]
        assert base.keys() == item.keys()
        for key in base:
            assert base[key].dtype == item[key].dtype and torch.equal(base[key], item[key]), key


def test_verls_sft_loss_is_the_weighted_token_mean(rows, setup):
    """The float mask in verl's own loss (no_padding): -sum(w * log p) / sum(w) over the batch."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import sft_loss

    path, tokenizer, _ = setup
    item = DecisionWeightedSFTDataset([path], tokenizer, _config(decision_weight=8))[0]
    mask = item["loss_mask"]
    log_prob = -torch.rand(mask.shape[0], generator=torch.Generator().manual_seed(0))
    nested = lambda t: torch.nested.as_nested_tensor([t], layout=torch.jagged)  # noqa: E731
    data = TensorDict({"loss_mask": nested(mask)}, batch_size=[1])
    tu.assign_non_tensor(data, pad_mode="no_padding", dp_size=1, batch_num_tokens=mask.sum().item())
    loss, _ = sft_loss(None, {"log_probs": nested(log_prob)}, data)
    target = torch.roll(mask, -1)  # the mask of token t+1 weighs the log-prob at t
    assert loss.item() == pytest.approx((-(log_prob * target).sum() / mask.sum()).item(), rel=1e-6)


@pytest.mark.parametrize("bad", [0, -2, True, "8"])
def test_bad_weight_is_refused(setup, bad):
    path, tokenizer, _ = setup
    with pytest.raises(UserError, match="decision_weight must be a number > 0"):
        DecisionWeightedSFTDataset([path], tokenizer, _config(decision_weight=bad))


def test_padded_mode_is_refused(setup):
    """verl's padded path reads the mask as bool: a weight there would be dropped silently."""
    path, tokenizer, _ = setup
    with pytest.raises(UserError, match="pad_mode=no_padding"):
        DecisionWeightedSFTDataset([path], tokenizer, _config(decision_weight=8, pad_mode="right"))
