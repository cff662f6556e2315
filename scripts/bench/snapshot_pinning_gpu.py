"""What a snapshot save costs the host and the step, by how its pinned host buffers are allocated.

    python -m scripts.bench.snapshot_pinning_gpu --out runs/pinning.json          # on a CUDA machine
    python -m scripts.bench.snapshot_pinning_gpu --results runs/pinning.json --context "..."

For each architecture (fp32 tensors of Qwen2.5-1.5B's and 7B's parameter shapes, on the GPU) and each
allocation, in a fresh process: ``SnapshotStore(max_versions=1)`` saves the weights ``--saves`` times as the
trainer does (``begin_save``, then ``wait_saved`` before the next write), each save begun before a fixed
compute load (bf16 matmuls standing in for the actor update) is queued on the current stream. Allocations:
``one_buffer`` (one buffer of the weights' exact bytes per copy, page-locked with ``cudaHostRegister``),
``per_tensor`` (one ``torch.empty(pin_memory=True)`` per tensor through PyTorch's caching host allocator,
which rounds each to a power of two) and ``one_buffer_bf16`` (the copy narrowed to bfloat16 on the GPU).

Per save: ``host_s``, the host's time inside ``begin_save``; ``stream_s``, the compute stream's time across
it (what ``verl_ext/time/snapshot_save`` reads); ``added_s``, the save's share of the critical path
(save-plus-load time minus the load alone). Memory: the process's resident host bytes added by the saves.
The first save allocates; the table gives it apart from the median of the later ones.

Docs section (``--write``; printed otherwise): docs/results.md, "## GPU: snapshot host buffers, ...".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench.report import publish, script_parser, table, target

ALLOCATIONS = ("one_buffer", "per_tensor", "one_buffer_bf16")
VOCAB = 516  # the local tokenizer of the hook-cost runs' models (docs/bench_results/hook_cost_*)
HEADING = "## GPU: snapshot host buffers, one registered buffer against per-tensor pinned allocations"


def qwen2_shapes(arch: str, vocab: int) -> list[list[tuple[int, ...]]]:
    """Parameter shapes of a Qwen2 model of ``verl_ext.tiny_model.ARCHITECTURES[arch]``, grouped per
    layer (the embedding, the final norm and an untied head in groups of their own)."""
    from verl_ext.tiny_model import ARCHITECTURES

    a = ARCHITECTURES[arch]
    h, i, heads, kv = a["hidden_size"], a["intermediate_size"], a["num_attention_heads"], a["num_key_value_heads"]
    kv_dim = kv * h // heads
    layer = [(h, h), (h,), (kv_dim, h), (kv_dim,), (kv_dim, h), (kv_dim,), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    head = [] if a.get("tie_word_embeddings", True) else [[(vocab, h)]]
    return [[(vocab, h)], *[layer] * a["num_hidden_layers"], [(h,)], *head]


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(arch: str, allocation: str, saves: int, vocab: int, load_matmuls: int) -> dict:
    """One (arch, allocation) in this process; returns its row."""
    import torch

    from verl_ext.old_logits import snapshot

    if allocation == "per_tensor":  # the allocation before the one-buffer change, as it was
        snapshot.host_buffers_like = lambda live, pin, dtypes=None: [
            torch.empty(t.shape, dtype=d, device="cpu", pin_memory=pin)
            for t, d in zip(live, dtypes or [t.dtype for t in live], strict=True)
        ]
    params = [torch.empty(s, dtype=torch.float32, device="cuda").normal_() for g in qwen2_shapes(arch, vocab) for s in g]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def queue_load() -> None:
        for _ in range(load_matmuls):
            a @ a

    def timed_load(save_version: int | None, store: snapshot.SnapshotStore) -> tuple[float, float, float]:
        """The trainer's order: the save begins as the actor update starts (``set_version``), the
        update's work is queued behind it, and the optimizer step waits for the copies."""
        torch.cuda.synchronize()
        start, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        host0 = time.perf_counter()
        if save_version is not None:
            store.begin_save(save_version, params)
        after.record()
        host_s = time.perf_counter() - host0
        queue_load()
        store.wait_saved()
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return host_s, start.elapsed_time(after) / 1e3, start.elapsed_time(end) / 1e3

    bf16 = allocation == "one_buffer_bf16"  # snapshot.dtype=bf16: the copy narrowed on the GPU
    store = snapshot.SnapshotStore(max_versions=1, pin_memory=True, float32_as=torch.bfloat16 if bf16 else None)
    timed_load(None, store)  # warm the matmuls up
    load_alone = statistics.median(timed_load(None, store)[2] for _ in range(saves))
    rss0 = resident_bytes()
    runs = [timed_load(v, store) for v in range(saves)]
    rss1 = resident_bytes()
    assert all(torch.equal(s, p.to(s.dtype).cpu()) for s, p in zip(store.get(saves - 1), params))  # the weights
    later = runs[1:]
    return {
        "arch": arch, "allocation": allocation, "param_bytes": sum(p.numel() * 4 for p in params),
        "tensors": len(params), "saves": saves, "load_s": load_alone,
        "first": {"host_s": runs[0][0], "stream_s": runs[0][1], "added_s": runs[0][2] - load_alone},
        "later": {k: statistics.median(r[i] - (load_alone if k == "added_s" else 0) for r in later)
                  for i, k in enumerate(("host_s", "stream_s", "added_s"))},
        "resident_bytes_added": rss1 - rss0,
        "card": torch.cuda.get_device_name(0),
    }


def report(rows: list[dict], context: str) -> str:
    lines = [HEADING, "",
             f"`python -m scripts.bench.snapshot_pinning_gpu` ({context}).",
             "",
             table(["arch", "allocation", "weights GB", "load s", "first: host s", "first: added s", "later: host s",
                    "later: stream s", "later: added s", "resident GB (x weights)"],
                   [[r["arch"], r["allocation"], f"{r['param_bytes'] / 1e9:.2f}", f"{r['load_s']:.3f}",
                     f"{r['first']['host_s']:.2f}", f"{r['first']['added_s']:.2f}",
                     *(f"{r['later'][k]:.4f}" for k in ("host_s", "stream_s", "added_s")),
                     f"{r['resident_bytes_added'] / 1e9:.1f} ({r['resident_bytes_added'] / r['param_bytes']:.2f}x)"]
                    for r in rows], align="llrrrrrrrr")]
    by = {(r["arch"], r["allocation"]): r for r in rows}
    for arch in dict.fromkeys(r["arch"] for r in rows):
        one, per = by.get((arch, "one_buffer")), by.get((arch, "per_tensor"))
        if one and per:
            lines.append(
                f"\n{arch}: one buffer holds {one['resident_bytes_added'] / one['param_bytes']:.2f}x the weights' bytes "
                f"against {per['resident_bytes_added'] / per['param_bytes']:.2f}x per tensor; its first save takes "
                f"{one['first']['host_s']:.1f} s against {per['first']['host_s']:.1f} s; a later save adds "
                f"{one['later']['added_s'] * 1e3:.1f} ms against {per['later']['added_s'] * 1e3:.1f} ms to the "
                f"{one['load_s']:.2f} s load.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__, context=True)
    parser.add_argument("--archs", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b"])
    parser.add_argument("--allocations", nargs="+", choices=ALLOCATIONS, default=list(ALLOCATIONS))
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--load-matmuls", type=int, default=600, help="8192^2 bf16 matmuls per load (~1 s on an H200)")
    parser.add_argument("--out", type=Path, help="JSON lines, one per (arch, allocation)")
    parser.add_argument("--results", type=Path, help="write the docs section from this --out file")
    parser.add_argument("--one", nargs=2, metavar=("ARCH", "ALLOCATION"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(*args.one, args.saves, args.vocab, args.load_matmuls)))
        return
    if args.results:
        rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
        publish(target(args), HEADING, report(rows, args.context or rows[0]["card"]))
        return
    if args.out is None:
        parser.error("give --out (measure) or --results (write the docs section)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for arch in args.archs:
        for allocation in args.allocations:
            print(f"[pinning] {arch} {allocation} ...", flush=True)
            done = subprocess.run(
                [sys.executable, __file__, "--one", arch, allocation, "--saves", str(args.saves),
                 "--vocab", str(args.vocab), "--load-matmuls", str(args.load_matmuls)],
                capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                continue
            row = done.stdout.strip().splitlines()[-1]
            with args.out.open("a") as f:
                f.write(row + "\n")
            print(row, flush=True)


if __name__ == "__main__":
    main()
