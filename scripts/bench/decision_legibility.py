"""Where, in a critical switching step's prompt, is what decides "tools shorter" vs "GUI shorter"
(issue 25)? Computed from the decision rows themselves (``verl-ext prepare-data text_hybrid_decisions``,
``verl_ext.envs.decisions.decision_rows``), no model involved:

- **label by subgoal**: the decision's subgoal (``app.subgoals[index]``), by the first word of its
  text (settings_panel: ``turn``/``set`` one setting, ``restore`` a section): how often that word
  alone gives the shorter way (the share of rows whose label is their word's majority label);
- **same task, both labels**: rows whose task instance also has rows of the other label: their first
  user turn (the task's numbered subgoal list and the first page) is the same text;
- **last page**: rows whose last observation's page (the text after ``Page (``) is also the last page
  of a row of the other label: the screen the model answers from does not tell them apart;
- **subgoals done vs steps shown**: the decision's subgoal is the list's item ``index + 1`` (the oracle
  and the row prefixes do the subgoals in order); the prompt shows no count of subgoals done, only the
  env's step counter, which differs from ``index`` when an earlier subgoal took 0 or 2+ actions;
- **tokens back**: how far (tiny tokenizer, chat template with the row's tools) the decision's
  subgoal text lies before the end of the prompt, where it appears only in the task line.

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


def subgoal_word(row: dict[str, Any]) -> str:
    """The first word of the text of the subgoal this decision row decides."""
    from verl_ext.envs.text_hybrid import make_task

    spec, decision = row["extra_info"]["env"], row["extra_info"]["decision"]
    app, _, _ = make_task(spec["task"], spec["seed"])
    return app.subgoals[decision["index"]].text.split()[0]


def last_page(row: dict[str, Any]) -> str:
    """The page of the prompt's last observation (title and elements), without result or step counter."""
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
    """Tokens from the decision's subgoal text (its one occurrence, in the task line) to the end of
    the prompt the ``decision_turn`` loop builds (chat template, row's tools, generation prompt)."""
    prompt = tokenizer.apply_chat_template(json.loads(row["prompt"]), tools=json.loads(row["extra_info"]["tools"]),
                                           add_generation_prompt=True, tokenize=False)
    start = prompt.index(subgoal_text)
    return len(tokenizer.encode(prompt[start:], add_special_tokens=False))


def measure(rows: list[dict[str, Any]], tokenizer: Any | None) -> dict[str, Any]:
    """The measurements of the module doc over ``rows`` (one split of one seed)."""
    from verl_ext.envs.text_hybrid import make_task

    labels = [r["extra_info"]["decision"]["better"] for r in rows]
    words = [subgoal_word(r) for r in rows]
    purity, counts = label_purity(words, labels)
    instances = [(r["extra_info"]["env"]["task"], r["extra_info"]["env"]["seed"]) for r in rows]
    out = {"n": Counter(labels), "purity": purity, "by_word": counts,
           "same_task": shared_across_labels(instances, labels),
           "last_page": shared_across_labels([last_page(r) for r in rows], labels),
           "step_is_index": float(np.mean([shown_step(r) == r["extra_info"]["decision"]["index"] for r in rows]))}
    if tokenizer is not None:
        back = []
        for r, (task, seed) in zip(rows, instances):
            app, _, _ = make_task(task, seed)
            back.append(tokens_back(r, tokenizer, app.subgoals[r["extra_info"]["decision"]["index"]].text))
        out["tokens_back"] = back
    return out


def report(results: dict[int, dict[str, Any]], command: str, templates: str) -> str:
    seeds = sorted(results)
    n = Counter()
    by_word: dict[str, Counter] = defaultdict(Counter)
    for res in results.values():
        n.update(res["n"])
        for word, c in res["by_word"].items():
            by_word[word].update(c)

    def per_seed(get) -> str:
        v = np.array([get(results[s]) for s in seeds], float)
        return f"{v.mean():.2f} (seeds: " + ", ".join(f"{x:.2f}" for x in v) + ")"

    lines = [HEADING, "",
             f"`{command}`: the training decision rows (`verl-ext prepare-data text_hybrid_decisions`, "
             f"128 a seed, templates {templates}) of seeds {', '.join(map(str, seeds))}: {n['tool']} where tools "
             f"are shorter, {n['gui']} where the GUI is. No model involved.", "",
             "| the decision's subgoal (first word) | tools shorter | GUI shorter |", "|---|---|---|"]
    lines += [f"| `{word}` | {c['tool']} | {c['gui']} |" for word, c in sorted(by_word.items())]
    lines += ["", "| measurement | value |", "|---|---|",
              f"| share of rows whose label is their subgoal word's majority label | {per_seed(lambda r: r['purity'])} |",
              f"| GUI-shorter rows whose task instance also has tools-shorter rows (same task text and first page) | "
              f"{per_seed(lambda r: r['same_task'].get('gui', float('nan')))} |",
              f"| GUI-shorter rows whose last page is also the last page of a tools-shorter row | "
              f"{per_seed(lambda r: r['last_page'].get('gui', float('nan')))} |",
              f"| tools-shorter rows whose last page is also the last page of a GUI-shorter row | "
              f"{per_seed(lambda r: r['last_page'].get('tool', float('nan')))} |",
              f"| rows whose step counter equals the number of subgoals done | {per_seed(lambda r: r['step_is_index'])} |"]
    if all("tokens_back" in r for r in results.values()):
        back = np.concatenate([r["tokens_back"] for r in results.values()])
        lines.append(f"| tokens from the decision's subgoal text (task line only) to the end of the prompt | "
                     f"median {np.median(back):.0f}, range {back.min()}-{back.max()} |")
    return "\n".join(lines + [""])


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__.split("\n\n")[0], REPO / "runs/decision_legibility", steps=0, seeds=[0, 1, 2])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--templates", default="settings_panel")
    parser.add_argument("--tokenizer", default=None, help="a model dir whose tokenizer counts the tokens back")
    args = parser.parse_args(argv)
    from verl_ext.envs.decisions import decision_rows

    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results = {seed: measure(decision_rows(args.rows, seed, "train", args.templates.split(",")), tokenizer)
               for seed in args.seeds}
    command = (f"python scripts/bench/decision_legibility.py --seeds {' '.join(map(str, args.seeds))} --templates "
               f"{args.templates}" + (" --tokenizer <the tiny model>" if args.tokenizer else ""))
    text = report(results, command, args.templates)
    write_section(args.doc, HEADING, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
