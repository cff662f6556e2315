"""How much of a model's probability goes to naming a tool at each held-out critical switching step: exact, not sampled. For each decision row (``verl-ext prepare-data text_hybrid_decisions``)
the prompt is built as the ``decision_turn`` loop builds it (the chat template with the row's tools
and the generation prompt), and the probability of the reply opening

    \\n<tool_call>\\n{"name": "<function>

is computed for ``computer_use`` and for each app tool (teacher forcing from one cached prompt pass).
``p_tool`` = the sum over app tools, ``p_gui`` = ``computer_use``'s, ``tool_share`` = ``p_tool /
(p_tool + p_gui)``: the model's GUI-vs-tool decision at that state, separated from whether it
would then write the arguments well. Reported by which way is shorter from that state.

    python scripts/bench/decision_probe.py MODEL_DIR ROWS.parquet [--out probe.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys

OPENING = '\n<tool_call>\n{{"name": "{}'  # no closing quote: the tokenizer merges it with what follows


def decision_prompt(tokenizer, messages: list[dict], tools: list[dict]) -> str:
    """The prompt of the turn after ``messages``, as the ``decision_turn`` loop builds it (the chat
    template with ``tools`` and the generation prompt)."""
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def continuation_ids(tokenizer, prompt: str, prompt_ids: list[int], text: str) -> list[int]:
    """The tokens ``text`` adds after ``prompt`` (encoded as ``prompt_ids``); refused where encoding the
    two together changes the prompt's tokens, since teacher forcing from the prompt pass would then be wrong."""
    ids = tokenizer.encode(prompt + text, add_special_tokens=False)
    if ids[:len(prompt_ids)] != prompt_ids:
        raise RuntimeError("the opening's tokens do not extend the prompt's; cannot teacher-force it")
    return ids[len(prompt_ids):]


def opening_logprobs(model, tokenizer, messages: list[dict], tools: list[dict], names: list[str]) -> dict[str, float]:
    """log P(the reply opens ``OPENING`` with ``name``) for each of ``names``, at the turn after ``messages``
    (``decision_prompt``), by teacher forcing from one prompt pass."""
    import torch

    prompt = decision_prompt(tokenizer, messages, tools)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
    logp = {}
    for name in names:
        cont = continuation_ids(tokenizer, prompt, prompt_ids, OPENING.format(name))
        with torch.no_grad():
            step = model(torch.tensor([cont]), past_key_values=copy.deepcopy(out.past_key_values), use_cache=True)
        logits = torch.cat([out.logits[:, -1:], step.logits[:, :-1]], dim=1).log_softmax(-1)[0]
        logp[name] = float(logits[torch.arange(len(cont)), torch.tensor(cont)].sum())
    return logp


def probe(model_dir: str, rows_path: str) -> dict:
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    per_row = []
    for _, row in pd.read_parquet(rows_path).iterrows():
        decision = row["extra_info"]["decision"]
        names = ["computer_use", *list(decision["app_tools"])]
        logp = opening_logprobs(model, tokenizer, json.loads(row["prompt"]), json.loads(row["extra_info"]["tools"]), names)
        p_gui = math.exp(logp["computer_use"])
        p_tool = sum(math.exp(logp[n]) for n in names[1:])
        per_row.append({"better": decision["better"], "p_gui": p_gui, "p_tool": p_tool,
                        "tool_share": p_tool / (p_tool + p_gui) if p_tool + p_gui > 0 else float("nan")})
    summary = {}
    for better in ("tool", "gui"):
        rows = [r for r in per_row if r["better"] == better]
        for key in ("p_tool", "p_gui", "tool_share"):
            summary[f"{key}_{better}_shorter"] = sum(r[key] for r in rows) / len(rows) if rows else float("nan")
        summary[f"n_{better}_shorter"] = len(rows)
    return {"summary": summary, "rows": per_row}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("rows")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = probe(args.model, args.rows)
    print(json.dumps(result["summary"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
