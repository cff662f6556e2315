"""Full weights into a Ray actor: a dict of torch tensors (pickled) against ``wire.named_to_wire``'s numpy byte views.

    python -m scripts.bench.weight_wire [--arch qwen2.5-0.5b] [--repeats 3] [--write]

Random bf16 tensors of the architecture's parameter shapes (as the trainer sends them to the ``hf`` rollout
server and the ``dedicated`` scorer). Each repeat sends both forms to one actor, which rebuilds every tensor
and sums an element of each, in alternating order; the table gives the medians and their ratio. The
numbers are this host's (one Ray worker); on a GPU the device-to-host copy comes on top.

Docs section (``--write``; printed otherwise): docs/results.md, "## Weights over Ray: torch tensors vs numpy byte views".
"""

from __future__ import annotations

import platform
import statistics
import sys
import time

import ray
import torch

from scripts.bench.report import publish, script_parser, table, target

from verl_ext.backends.cpu.wire import named_from_wire, named_to_wire  # noqa: E402
from verl_ext.tiny_model import ARCHITECTURES, build_tokenizer  # noqa: E402

HEADING = "## Weights over Ray: torch tensors vs numpy byte views"


@ray.remote
class Receiver:
    def tensors(self, state: dict[str, torch.Tensor]) -> float:
        return float(sum(t.reshape(-1)[0].float() for t in state.values()))

    def wire(self, state) -> float:
        return float(sum(t.reshape(-1)[0].float() for _, t in named_from_wire(state)))


def parameter_shapes(arch: str) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of ``verl-ext make-tiny-model --arch ARCH`` (the local tokenizer's
    vocabulary), built on the meta device: no memory, no weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dims = {k: v for k, v in ARCHITECTURES[arch].items() if k != "vision"}
    config = Qwen2Config(vocab_size=len(build_tokenizer()), **{"tie_word_embeddings": True, **dims})
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def main(argv: list[str]) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(a for a in ARCHITECTURES if "vision" not in ARCHITECTURES[a]))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    shapes = parameter_shapes(args.arch)
    state = {name: torch.randn(shape).to(torch.bfloat16) for name, shape in shapes.items()}
    n_bytes = sum(t.numel() * t.element_size() for t in state.values())
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, object_store_memory=max(2**30, 3 * n_bytes))
    receiver = Receiver.remote()
    ray.get(receiver.wire.remote({}))  # the actor is up before any timing
    times: dict[str, list[float]] = {"torch tensors": [], "numpy byte views (to_wire)": []}
    for repeat in range(args.repeats):
        order = list(times) if repeat % 2 == 0 else list(reversed(times))
        for form in order:
            start = time.perf_counter()
            if form == "torch tensors":
                ray.get(receiver.tensors.remote(state))
            else:
                ray.get(receiver.wire.remote(named_to_wire(state.items())))
            times[form].append(time.perf_counter() - start)
            print(f"[weight_wire] repeat {repeat}: {form} {times[form][-1]:.2f} s", flush=True)
    ray.shutdown()

    medians = {form: statistics.median(t) for form, t in times.items()}
    base = medians["torch tensors"]
    lines = [HEADING, "",
             f"`python -m scripts.bench.weight_wire --arch {args.arch} --repeats {args.repeats}`: {len(state)} bf16 "
             f"tensors of {args.arch}'s parameter shapes ({n_bytes / 1e9:.2f} GB); {platform.machine()}, {torch.get_num_threads()} torch threads, Python "
             f"{platform.python_version()}, Ray {ray.__version__}, medians of {args.repeats} repeats.", "",
             table(["form", "median (s)", "GB/s", "vs torch tensors"],
                   [[form, f"{m:.2f}", f"{n_bytes / 1e9 / m:.2f}", f"{m / base:.3f}x"] for form, m in medians.items()])]
    publish(target(args), HEADING, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
