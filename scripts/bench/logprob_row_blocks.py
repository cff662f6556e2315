"""verl's one-row-at-a-time log-prob fallback against verl-ext's ``logprob_row_blocks`` patch.

A block of rows at a time, same per-row math, on the packed ``(tokens, vocab)`` logits that verl's FSDP
engine passes it: forward + backward time and whether outputs and gradients are bitwise equal.

    python -m scripts.bench.logprob_row_blocks --device cuda --tokens 20000 --vocab 512 151936

Docs section: none of its own (prints a table the docs quote).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from scripts.bench.report import table


def timed(fn, logits, labels, device: str, repeats: int):
    """Median seconds of forward + backward, the output and the gradient of the last pass."""
    import torch

    times = []
    for _ in range(repeats + 1):
        x = logits.detach().clone().requires_grad_()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(x, labels)
        out.backward(torch.ones_like(out))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), out.detach(), x.grad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=20000, help="rows of the packed logits (a micro-batch's tokens)")
    parser.add_argument("--vocab", type=int, nargs="+", default=[512])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    import verl.utils.torch_functional as verl_functional  # noqa: F401  (applies verl-ext's patches)
    from verl_ext import patches

    verl_loop = patches.REPLACED.get("logprob_row_blocks")
    if verl_loop is None:
        print(f"logprob_row_blocks is not applied here ({patches.ROW_BLOCKS_SWITCH}=0?)", file=sys.stderr)
        return 2
    header = ["device", "tokens x vocab", "dtype", "verl, row at a time: s", "row blocks: s", "speed-up",
              "outputs equal", "gradients equal"]
    print("\n".join(table(header, [], align="lllrrr").splitlines()[:2]), flush=True)  # rows follow as measured
    torch.manual_seed(0)
    for vocab in args.vocab:
        for dtype in args.dtypes:
            logits = (3 * torch.randn(args.tokens, vocab, device=args.device)).to(getattr(torch, dtype))
            labels = torch.randint(0, vocab, (args.tokens,), device=args.device)
            slow, out_a, grad_a = timed(verl_loop, logits, labels, args.device, args.repeats)
            fast, out_b, grad_b = timed(patches.logprobs_in_row_blocks, logits, labels, args.device, args.repeats)
            row = [args.device, f"{args.tokens} x {vocab}", dtype, f"{slow:.3f}", f"{fast:.4f}", f"{slow / fast:.0f}x",
                   torch.equal(out_a, out_b), torch.equal(grad_a, grad_b)]
            print(table(header, [row]).splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
