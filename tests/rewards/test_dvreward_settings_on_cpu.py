"""Settings of the `dvreward` manager: validation, endpoint choice, reading a row's artifact."""

import base64
import binascii

import pytest

from verl_ext.rewards.dvreward.settings import DVRewardSettings, field_value


def test_bad_values_name_the_key():
    with pytest.raises(ValueError, match=r"reward\.reward_kwargs\.dvreward\.on_failure='ignore'"):
        DVRewardSettings.from_mapping({"on_failure": "ignore"})
    with pytest.raises(ValueError, match=r"reward\.reward_kwargs\.dvreward\.judge_ur\b"):
        DVRewardSettings.from_mapping({"judge_ur": "http://x/v1"})


def test_endpoint_prefers_judge_url_then_router_address():
    settings = DVRewardSettings.from_mapping({"timeout_s": 5})
    router = settings.endpoint("10.0.0.2:8000", "/models/judge")
    assert (router.base_url, router.model, router.timeout_s) == ("http://10.0.0.2:8000/v1", "/models/judge", 5)
    own = DVRewardSettings.from_mapping({"judge_url": "https://api.example/v1", "model": "m"})
    assert own.endpoint("10.0.0.2:8000", None).base_url == "https://api.example/v1"


def test_artifact_from_row_fields():
    png = b"\x89PNG fake"
    b64 = base64.b64encode(png).decode()
    fields = {"env": {"png": png, "url": f"data:image/jpeg;base64,{b64}", "b64": b64, "dom": "<div/>"}}

    def read(key, kind="auto"):
        return DVRewardSettings(artifact_key=key, artifact_kind=kind).artifact(fields, "resp")

    assert DVRewardSettings().artifact(fields, "resp").data == "resp"  # default: the response text
    assert (read("env.png").kind, read("env.png").data) == ("image", b64)
    assert (read("env.url").kind, read("env.url").mime, read("env.url").data) == ("image", "image/jpeg", b64)
    assert (read("env.b64", "image").kind, read("env.dom").kind) == ("image", "text")
    assert read("env.missing") is None
    with pytest.raises(binascii.Error):
        read("env.dom", "image")  # not base64: a config error, not a judge fault per question
    assert field_value({"a": {"b": 1}}, "a.b") == 1 and field_value({"a": 1}, "a.b") is None
