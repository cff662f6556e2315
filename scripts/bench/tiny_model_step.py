"""Forward + backward time of the tiny random Qwen2 by batch shape, attention kernel and gradient checkpointing.

Outside verl: the compute floor under a verl step of the same model. verl pads every RL row to
``max_prompt_length + max_response_length`` when ``use_remove_padding`` is off (no flash-attn), so a
3.5k-token decision prompt of ``recipes/toolcua_sft_rl`` runs as an 8320-token row; this measures what that
padding and gradient checkpointing cost against the same rows unpadded.

    python -m scripts.bench.tiny_model_step --device cuda --width 256 --layers 4 --rows 6 --tokens 3500 --padded-to 8320

Docs section: none of its own (prints a table the docs quote).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.report import table


def time_step(model, input_ids, attention_mask, device: str, repeats: int) -> list[float]:
    """Seconds of ``repeats`` forward + backward passes (after two warm-up passes), synchronised."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    times = []
    for i in range(repeats + 2):
        sync()
        start = time.perf_counter()
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=device != "cpu"):
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        logits.float().logsumexp(-1).mean().backward()
        sync()
        if i >= 2:
            times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return times


def batch(rows: int, tokens: int, padded_to: int, vocab: int, device: str):
    """``rows`` sequences of ``tokens`` real tokens, right-padded to ``padded_to`` (0: no padding)."""
    import torch

    width = max(padded_to, tokens)
    input_ids = torch.randint(3, vocab, (rows, width), device=device)
    mask = torch.zeros(rows, width, dtype=torch.long, device=device)
    mask[:, :tokens] = 1
    return input_ids, mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=6, help="sequences per forward (one micro-batch)")
    parser.add_argument("--tokens", type=int, default=3500, help="real tokens per sequence")
    parser.add_argument("--padded-to", type=int, default=8320, help="the padded width verl would use")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here as well")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM

    from verl_ext.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_model(tmp, seed=0, hidden_size=args.width, num_hidden_layers=args.layers)
        configs = list(itertools.product(("sdpa", "eager"), (False, True), (args.padded_to, 0)))
        rows = []
        for attn, checkpointing, padded_to in configs:
            model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn).to(args.device)
            if checkpointing:
                model.gradient_checkpointing_enable()
            model.train()
            ids, mask = batch(args.rows, args.tokens, padded_to, model.config.vocab_size, args.device)
            times = time_step(model, ids, mask, args.device, args.repeats)
            row = {"attention": attn, "gradient_checkpointing": checkpointing, "rows": args.rows,
                   "tokens": args.tokens, "width": ids.shape[1], "median_s": statistics.median(times)}
            rows.append(row)
            print(f"[tiny_model_step] {row}", file=sys.stderr, flush=True)
            del model
    fastest = min(r["median_s"] for r in rows)
    print(table(["attention", "gradient checkpointing", "rows x width (real tokens)", "forward + backward s", "x fastest"],
                [[r["attention"], "on" if r["gradient_checkpointing"] else "off", f"{r['rows']} x {r['width']} ({r['tokens']})",
                  f"{r['median_s']:.4f}", f"{r['median_s'] / fastest:.1f}"] for r in rows], align="lllrr"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"device": args.device, "width": args.width, "layers": args.layers,
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
