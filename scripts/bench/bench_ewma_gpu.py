"""GPU timings of the PPO-EWMA shadow update and of weight snapshots to pinned host memory.

Random bf16 weights shaped like Qwen2-1.5B / Qwen2-7B (no download), an fp32 shadow, on one GPU. Times,
per model: device copy bandwidth and from it the EWMA floor (10 bytes/param: read bf16 θ, read and write the
fp32 shadow); the EWMA update (naive per-tensor ``mul_``/``add_``, ``torch._foreach_lerp_``, and
``EWMAShadow.update``'s portable and fused Triton paths, checked equal); EWMA swap_in + swap_out; snapshot
save (D2H to pinned host) and load (H2D) through ``SnapshotStore``. Medians of CUDA-event timings after warm-up.

    python -m scripts.bench.bench_ewma_gpu [--out results.json] [--write]

Docs section (``--write``; printed otherwise): docs/results.md, "### GPU: EWMA update and snapshots".
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

import torch

from verl_ext.old_logits.ewma import EWMAShadow
from verl_ext.old_logits.snapshot import SnapshotStore

from scripts.bench.report import publish, script_parser, table, target

# Qwen2-1.5B / Qwen2-7B: the shapes of verl_ext.tiny_model's qwen2.5 architectures (the same as Qwen2's),
# with the real vocabularies (config.json of Qwen/Qwen2-1.5B and Qwen/Qwen2-7B)
QWEN2 = {"1.5B": ("qwen2.5-1.5b", 151936), "7B": ("qwen2.5-7b", 152064)}
BETA = 8 / 9


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


def time_ms(fn: Callable[[], None], warmup: int = 3, reps: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes/s read+written by a 4 GiB device-to-device copy."""
    src = torch.empty(2**31, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


def bench_update(params: list[list[torch.Tensor]]) -> dict[str, float]:
    """EWMA update: naive, _foreach_lerp_, EWMAShadow (torch path, fused path); fused == torch check."""
    flat = [p for grp in params for p in grp]
    shadow = [p.float() for p in flat]

    def naive() -> None:
        for s, p in zip(shadow, flat):
            s.mul_(BETA).add_(p, alpha=1 - BETA)

    def foreach_lerp() -> None:
        i = 0
        for grp in params:  # cast one layer at a time: a full fp32 copy of θ would not fit for 7B
            torch._foreach_lerp_(shadow[i : i + len(grp)], [p.float() for p in grp], 1 - BETA)
            i += len(grp)

    res = {"naive_ms": time_ms(naive), "foreach_lerp_ms": time_ms(foreach_lerp)}
    shadow.clear()

    # the fused Triton path against the portable torch path, from the same state (first layers only)
    subset = [p.clone() for p in flat[:13]]
    fused, portable = EWMAShadow(subset, BETA, fused=True), EWMAShadow(subset, BETA, fused=False)
    for p in subset:
        p.add_(torch.randn_like(p) * 0.01)
    fused.update()
    portable.update()
    res["fused_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(fused.average(), portable.average()))
    res["ours_torch_ms"] = time_ms(EWMAShadow(flat, BETA, fused=False).update)
    torch.cuda.empty_cache()
    ewma = EWMAShadow(flat, BETA)
    res["ours_ms"] = time_ms(ewma.update)

    def swap() -> None:
        with ewma.swap_in():
            pass

    res["swap_in_out_ms"] = time_ms(swap, warmup=1, reps=5)
    return res


def bench_snapshot(flat: list[torch.Tensor]) -> dict[str, float]:
    """SnapshotStore.save (D2H into pinned buffers, reused after eviction) and the H2D load."""
    store = SnapshotStore(max_versions=1)
    nbytes = sum(p.numel() * p.element_size() for p in flat)
    version = iter(range(10**6))
    save_ms = time_ms(lambda: store.save(next(version), flat), warmup=2, reps=5)
    snap = store.get(store.versions[-1])

    def load() -> None:
        for p, s in zip(flat, snap):
            p.copy_(s, non_blocking=True)

    load_ms = time_ms(load, warmup=1, reps=5)
    return {
        "snapshot_GB": nbytes / 1e9,
        "snapshot_save_GBps": nbytes / (save_ms / 1e3) / 1e9,
        "snapshot_load_GBps": nbytes / (load_ms / 1e3) / 1e9,
        "snapshot_pinned": float(snap[0].is_pinned()),
    }


def bench_model(name: str, bandwidth: float) -> dict[str, float]:
    groups = qwen2_shapes(*QWEN2[name])
    g = torch.Generator(device="cuda").manual_seed(0)
    params = [[torch.randn(s, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02 for s in grp] for grp in groups]
    flat = [p for grp in params for p in grp]
    n = sum(p.numel() for p in flat)
    res: dict[str, float] = {"params_B": n / 1e9, "floor_ms": 10 * n / bandwidth * 1e3}
    res.update(bench_update(params))
    torch.cuda.empty_cache()
    res["ours_vs_floor"] = res["ours_ms"] / res["floor_ms"]
    res.update(bench_snapshot(flat))
    return res


HEADING = "### GPU: EWMA update and snapshots"


def render(results: dict) -> str:
    """The docs section: the run's card and bandwidth, one row per model, the fused-path check."""
    lines = [
        HEADING, "",
        f"`python -m scripts.bench.bench_ewma_gpu` on **{results['card']}** (torch {results['torch']}); "
        "shapes of " + " / ".join(f"Qwen2-{m}" for m in results["models"]) + ". Device copy in the same run: "
        f"**{results['copy_TBps']:.2f} TB/s**.", "",
        table(["Qwen2", "params", "floor", "naive `mul_`/`add_`", "`_foreach_lerp_` (fp32 cast per layer)",
               "`EWMAShadow` torch path", "`EWMAShadow` fused (default on CUDA)", "fused / floor", "swap in + out",
               "snapshot save (D2H, pinned)", "snapshot load (H2D)"],
              [[m, f"{r['params_B']:.2f} B", *(f"{r[k]:.2f} ms" for k in ("floor_ms", "naive_ms", "foreach_lerp_ms",
                                                                           "ours_torch_ms", "ours_ms")),
                f"{r['ours_vs_floor']:.2f}x", f"{r['swap_in_out_ms']:.2f} ms", f"{r['snapshot_save_GBps']:.1f} GB/s",
                f"{r['snapshot_load_GBps']:.1f} GB/s"] for m, r in results["models"].items()]),
    ]
    diffs = ", ".join(f"{m} {r['fused_max_abs_diff']:.3g}" for m, r in results["models"].items())
    lines += ["", f"Fused vs torch path, max |diff| of the average after one update: {diffs}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--out", default=None)
    parser.add_argument("--models", nargs="+", default=list(QWEN2))
    args = parser.parse_args()
    bw = copy_bandwidth()
    torch.cuda.empty_cache()
    card = torch.cuda.get_device_name()
    results = {"card": card, "torch": torch.__version__, "copy_TBps": bw / 1e12, "models": {}}
    for m in args.models:
        results["models"][m] = bench_model(m, bw)
        torch.cuda.empty_cache()
    publish(target(args), HEADING, render(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
