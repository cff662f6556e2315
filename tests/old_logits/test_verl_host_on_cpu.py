"""The trainer-side glue of the old-logit providers: per-token versions from verl rows."""

from __future__ import annotations

import pytest
import torch

from verl_ext.old_logits.trainer_side import token_versions


def test_versions_are_aligned_with_response_tokens_and_masked():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])
    extra = [{"token_global_steps": [3, 3, 4]}, {"token_global_steps": [5, None, 6, 6]}]
    out = token_versions(extra, mask, ["a", "b"])
    assert out.tolist() == [[3, 3, 4, -1], [5, -1, 6, 6]]


def test_missing_versions_name_the_rows_and_the_fix():
    mask = torch.tensor([[1, 1], [0, 0]])
    with pytest.raises(ValueError, match=r"\['a'\].*verl_ext trainer"):
        token_versions([{}, {}], mask, ["a", "pad_b"])  # the all-masked padding row is fine


def test_local_parameters_cover_fsdp_modules_and_megatron_chunk_lists():
    import torch

    from verl_ext.old_logits.swap import local_parameters

    one = torch.nn.Linear(3, 2)
    chunks = [torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)]  # Megatron: one module per virtual stage
    assert local_parameters(one) == list(one.parameters())
    assert local_parameters(chunks) == [*chunks[0].parameters(), *chunks[1].parameters()]
