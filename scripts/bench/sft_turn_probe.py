"""Does an SFT model's GUI-vs-tool choice follow the state? At every assistant turn of SFT
transcripts (``verl-ext prepare-data text_hybrid_sft``; repeated rows are probed once) the probability
that the reply opens with an app tool's name against ``computer_use``'s, exact, not sampled
(``decision_probe.opening_logprobs``): ``tool_share`` = P(any offered function but computer_use) /
(that + P(computer_use)), averaged separately over the turns where the oracle calls an app tool and
where it calls ``computer_use``. A model that reads the state puts a higher share at the tool turns;
greedy decoding names a tool only where the share is above one half (``verl-ext eval-sft``'s
``tool_turn_call_rate`` counts those replies when they also parse).

    python scripts/bench/sft_turn_probe.py MODEL_DIR sft_data/val.parquet [--max-rows 4] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from decision_probe import opening_logprobs


def turn_shares(model, tokenizer, rows: list[dict]) -> dict[str, list[float]]:
    """``tool_share`` at each assistant turn of ``rows``, keyed by the oracle's kind there (``tool`` / ``gui``)."""
    from verl_ext.envs.core import GUI_TOOL_NAME
    from verl_ext.envs.demos import turns_of

    shares: dict[str, list[float]] = {"tool": [], "gui": []}
    for row in rows:
        tools = json.loads(row["tools"])
        names = [GUI_TOOL_NAME, *(t["function"]["name"] for t in tools if t["function"]["name"] != GUI_TOOL_NAME)]
        for before, call in turns_of(json.loads(row["messages"])):
            logp = opening_logprobs(model, tokenizer, before, tools, names)
            p_gui, p_tool = math.exp(logp[GUI_TOOL_NAME]), sum(math.exp(logp[n]) for n in names[1:])
            shares["gui" if call["name"] == GUI_TOOL_NAME else "tool"].append(p_tool / (p_tool + p_gui))
    return shares


def summary(shares: dict[str, list[float]]) -> dict[str, float]:
    """Per kind of turn: how many, the mean ``tool_share`` and how many are above one half (greedy names a tool)."""
    out: dict[str, float] = {}
    for kind, values in shares.items():
        out[f"{kind}_turns"] = len(values)
        out[f"tool_share_at_{kind}_turns"] = sum(values) / len(values) if values else float("nan")
        out[f"above_half_at_{kind}_turns"] = sum(v > 0.5 for v in values)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="HF model dir (e.g. sft/global_step_N/huggingface)")
    parser.add_argument("rows", help="SFT parquet (prepare-data text_hybrid_sft .../val.parquet or train.parquet)")
    parser.add_argument("--max-rows", type=int, default=None, help="probe the first N distinct transcripts")
    parser.add_argument("--out", default=None, help="also write the summary and every turn's share to this JSON file")
    args = parser.parse_args(argv)

    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = pd.read_parquet(args.rows).drop_duplicates("messages").head(args.max_rows).to_dict("records")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    shares = turn_shares(model, tokenizer, rows)
    totals = summary(shares)
    print(json.dumps(totals))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": totals, "shares": shares}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
