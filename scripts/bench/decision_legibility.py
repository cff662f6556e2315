"""Where, in a critical switching step's prompt, is what decides "tools shorter" vs "GUI shorter"? Computed from the decision rows themselves (``verl-ext prepare-data text_hybrid_decisions``,
``verl_ext.envs.decisions.decision_rows``), no model involved:

- **label by subgoal**: the decision's subgoal (``app.subgoals[index]``), by the first word of its
  text (settings_panel: ``turn``/``set`` one setting, ``restore`` a section): how often that word
  alone gives the shorter way (the share of rows whose label is their word's majority label);
- **same task, both labels**: rows whose task instance also has rows of the other label: their first
  user turn (the task's numbered subgoal list and the first page) is the same text;
- **last observation**: rows whose last observation from its page on (``Page (`` to the end) also ends
  a row of the other label: the screen the model answers from does not tell them apart;
- **subgoals done vs steps shown**: the decision's subgoal is the list's item ``index + 1`` (the oracle
  and the row prefixes do the subgoals in order); the prompt shows no count of subgoals done, only the
  env's step counter, which differs from ``index`` when an earlier subgoal took 0 or 2+ actions;
- **tokens back**: how far (tiny tokenizer, chat template with the row's tools) the decision's
  subgoal text lies before the end of the prompt (its last occurrence): as the env renders
  observations by default it is only in the task line; with ``show_todo`` (``SHOW_TODO=1`` in the
  recipe) it leads the last observation's to-do list.

Each measurement is taken on the rows as built today and with ``show_todo`` (same tasks and states).

    python scripts/bench/decision_legibility.py --seeds 0 1 2 --tokenizer runs/.../huggingface
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from typing import Any

import numpy as np
from learning_runs import REPO, study_parser, write_section

HEADING = "## ToolCUA decision prompts: what decides the shorter way, and where it is"


def decided_subgoal(row: dict[str, Any]) -> str:
    """The text of the subgoal this decision row decides (its first word tells the kind)."""
    from verl_ext.envs.text_hybrid import make_task

    spec, decision = row["extra_info"]["env"], row["extra_info"]["decision"]
    app, _, _ = make_task(spec["task"], spec["seed"])
    return app.subgoals[decision["index"]].text


def last_observation(row: dict[str, Any]) -> str:
    """The prompt's last observation from its page on (title, elements, the to-do line where shown), without
    the result or the step counter."""
    content = json.loads(row["prompt"])[-1]["content"]
    return content[content.index("Page ("):]


def shown_step(row: dict[str, Any]) -> int:
    """The env's step counter in the prompt's last observation (``Step n/max``)."""
    content = json.loads(row["prompt"])[-1]["content"]
    return int(content[content.rindex("Step ") + 5:].split("/")[0])


def label_purity(words: list[str], labels: list[str]) -> tuple[float, dict[str, Counter]]:
    """Share of rows whose label is the majority label of their word, and the counts per word."""
    by_word: dict[str, Counter] = defaultdict(Counter)
    for word, label in zip(words, labels):
        by_word[word][label] += 1
    return sum(c.most_common(1)[0][1] for c in by_word.values()) / len(labels), dict(by_word)


def shared_across_labels(keys: list[Any], labels: list[str]) -> dict[str, float]:
    """Per label, the share of its rows whose key also occurs among rows of another label."""
    seen: dict[Any, set[str]] = defaultdict(set)
    for key, label in zip(keys, labels):
        seen[key].add(label)
    return {label: float(np.mean([len(seen[k]) > 1 for k, lab in zip(keys, labels) if lab == label]))
            for label in sorted(set(labels))}


def tokens_back(row: dict[str, Any], tokenizer: Any, subgoal_text: str) -> int:
    """Tokens from the decision's subgoal text (its last occurrence) to the end of the prompt the
    ``decision_turn`` loop builds (chat template, row's tools, generation prompt)."""
    prompt = tokenizer.apply_chat_template(json.loads(row["prompt"]), tools=json.loads(row["extra_info"]["tools"]),
                                           add_generation_prompt=True, tokenize=False)
    start = prompt.rindex(subgoal_text)
    return len(tokenizer.encode(prompt[start:], add_special_tokens=False))


def measure(rows: list[dict[str, Any]], tokenizer: Any | None) -> dict[str, Any]:
    """The measurements of the module doc over ``rows`` (one split of one seed)."""
    labels = [r["extra_info"]["decision"]["better"] for r in rows]
    subgoals = [decided_subgoal(r) for r in rows]
    words = [text.split()[0] for text in subgoals]
    purity, counts = label_purity(words, labels)
    instances = [(r["extra_info"]["env"]["task"], r["extra_info"]["env"]["seed"]) for r in rows]
    out = {"n": Counter(labels), "purity": purity, "by_word": counts,
           "same_task": shared_across_labels(instances, labels),
           "last_observation": shared_across_labels([last_observation(r) for r in rows], labels),
           "step_is_index": float(np.mean([shown_step(r) == r["extra_info"]["decision"]["index"] for r in rows]))}
    if tokenizer is not None:
        out["tokens_back"] = [tokens_back(r, tokenizer, text) for r, text in zip(rows, subgoals)]
    return out


SETTINGS = {False: "observations as rendered by default", True: "with the to-do list (`show_todo`)"}


def report(results: dict[bool, dict[int, dict[str, Any]]], command: str, templates: str) -> str:
    """``results[show_todo][seed]`` = ``measure``'s output."""
    plain = results[False]
    seeds = sorted(plain)
    n = Counter()
    by_word: dict[str, Counter] = defaultdict(Counter)
    for res in plain.values():
        n.update(res["n"])
        for word, c in res["by_word"].items():
            by_word[word].update(c)

    def per_seed(by_seed: dict[int, dict[str, Any]], get) -> str:
        v = np.array([get(by_seed[s]) for s in seeds], float)
        return f"{v.mean():.2f} (seeds: " + ", ".join(f"{x:.2f}" for x in v) + ")"

    def back(by_seed: dict[int, dict[str, Any]]) -> str:
        values = np.concatenate([r["tokens_back"] for r in by_seed.values()])
        return f"median {np.median(values):.0f}, range {values.min()}-{values.max()}"

    measurements = [
        ("share of rows whose label is their subgoal word's majority label", lambda r: per_seed(r, lambda x: x["purity"])),
        ("GUI-shorter rows whose task instance also has tools-shorter rows (same task text and first page)",
         lambda r: per_seed(r, lambda x: x["same_task"].get("gui", float("nan")))),
        ("GUI-shorter rows whose last observation (page, and the to-do line where shown) ends a tools-shorter row too",
         lambda r: per_seed(r, lambda x: x["last_observation"].get("gui", float("nan")))),
        ("tools-shorter rows whose last observation (page, and the to-do line where shown) ends a GUI-shorter row too",
         lambda r: per_seed(r, lambda x: x["last_observation"].get("tool", float("nan")))),
        ("rows whose step counter equals the number of subgoals done", lambda r: per_seed(r, lambda x: x["step_is_index"])),
    ]
    if all("tokens_back" in r for by_seed in results.values() for r in by_seed.values()):
        measurements.append(("tokens from the decision's subgoal text (last occurrence) to the end of the prompt", back))
    lines = [HEADING, "",
             f"`{command}`: the training decision rows (`verl-ext prepare-data text_hybrid_decisions`, "
             f"128 a seed, templates {templates}) of seeds {', '.join(map(str, seeds))}: {n['tool']} where tools "
             f"are shorter, {n['gui']} where the GUI is. No model involved.", "",
             "| the decision's subgoal (first word) | tools shorter | GUI shorter |", "|---|---|---|"]
    lines += [f"| `{word}` | {c['tool']} | {c['gui']} |" for word, c in sorted(by_word.items())]
    lines += ["", "| measurement | " + " | ".join(SETTINGS.values()) + " |", "|---" * (len(SETTINGS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(get(results[todo]) for todo in SETTINGS) + " |" for name, get in measurements]
    return "\n".join(lines + [""])


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__.split("\n\n")[0], REPO / "runs/decision_legibility", steps=0, seeds=[0, 1, 2],
                          doc=REPO / "docs/experiments/toolcua_decision_studies.md")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--templates", default="settings_panel")
    parser.add_argument("--tokenizer", default=None, help="a model dir whose tokenizer counts the tokens back")
    args = parser.parse_args(argv)
    from verl_ext.envs.decisions import decision_rows

    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results = {todo: {seed: measure(decision_rows(args.rows, seed, "train", args.templates.split(","),
                                                  show_todo=todo), tokenizer) for seed in args.seeds}
               for todo in SETTINGS}
    command = (f"python scripts/bench/decision_legibility.py --seeds {' '.join(map(str, args.seeds))} --templates "
               f"{args.templates}" + (" --tokenizer <the tiny model>" if args.tokenizer else ""))
    text = report(results, command, args.templates)
    write_section(args.doc, HEADING, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
