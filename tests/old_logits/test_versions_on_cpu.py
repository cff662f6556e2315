"""Per-token version spans: build, validate, compress, expand."""

import itertools
import random

import pytest
import torch

from verl_ext.old_logits.versions import (
    NO_VERSION,
    TokenVersionRecorder,
    compress_versions,
    expand_spans,
    single_version_fallback,
    spans_from_extra_fields,
    token_versions_tensor,
    validate_spans,
)


def test_compress_expand_round_trip():
    rng = random.Random(0)
    for _ in range(50):
        versions = [rng.choice([-1, 3, 3, 4, 7]) for _ in range(rng.randint(0, 40))]
        spans = compress_versions(versions)
        assert expand_spans(spans) == versions
        assert all(a[0] != b[0] for a, b in itertools.pairwise(spans))  # maximal runs


def test_recorder_writes_extra_fields_that_validate():
    rec = TokenVersionRecorder()
    rec.add(4, 3)
    rec.add(4, 2)  # same version: merged
    rec.add_unversioned(2)
    rec.add_unversioned(0)  # empty: ignored
    rec.add(5, 1)
    extra: dict = {"other": 1}
    rec.write_to(extra)
    spans = spans_from_extra_fields(extra)
    assert spans == [(4, 5), (NO_VERSION, 2), (5, 1)]
    validate_spans(spans, [1] * 5 + [0] * 2 + [1])
    assert spans_from_extra_fields({}) is None
    with pytest.raises(ValueError, match="add_unversioned"):
        rec.add(-1, 1)


@pytest.mark.parametrize(
    ("spans", "mask", "match"),
    [
        ([(4, 3)], [1, 1], "cover 3 tokens"),
        ([(4, 2), (-1, 1)], [1, 1, 1], "need a"),
        ([(4, 2)], [1, 0], "need a"),
        ([(5, 1), (4, 1)], [1, 1], "decrease"),
        ([(4, 0), (4, 2)], [1, 1], "positive"),
    ],
)
def test_validate_rejects(spans, mask, match):
    with pytest.raises(ValueError, match=match):
        validate_spans(spans, mask)


def test_tensor_expansion_padding_and_fallback():
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    fallback = single_version_fallback([0, 6, 2], [0, 6, 3])
    out = token_versions_tensor([[(3, 2), (-1, 1), (4, 1)], None, [(2, 1)]], 5, fallback, mask)
    assert out.tolist() == [[3, 3, -1, 4, -1], [6, 6, 6, -1, -1], [2, -1, -1, -1, -1]]
    with pytest.raises(ValueError, match="TokenVersionRecorder"):
        token_versions_tensor([None, None, None], 5, fallback, mask)
