"""End-to-end generate() speed: transformers' greedy generation with samattn's attention
(samattn.integrations.transformers) against attn_implementation="sdpa", same weights, same
run, alternating. A Llama of random weights (bf16, head dim 128, 32 query heads over 8 KV
heads), a 512-token prompt, 256 new tokens; batch 1, and batch 8 left-padded (prompts of
512 down to 256 tokens); dynamic and static caches. Eager (no CUDA graphs), as a user calls
generate(). Prints one JSON object (wall seconds per generate(), median of --repeats, tokens
per second, ratio samattn / sdpa in speed) and writes it to --out when given.

    python benchmarks/profiling/generate_speed.py --out generate.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers

from samattn.integrations import transformers as integration


def model(implementation: str, layers: int) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=4096, intermediate_size=4096,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=1024,
        max_position_embeddings=2048,
    )  # fmt: skip
    torch.manual_seed(0)
    built = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=implementation
    )
    built = built.to(device="cuda", dtype=torch.bfloat16).eval()
    built.generation_config.eos_token_id = None
    built.generation_config.pad_token_id = 0
    return built


def prompts(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and mask: lengths from `length` down to about half of it."""
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, 1024, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, : row * length // (2 * max(batch - 1, 1))] = 0
    return ids.masked_fill(mask == 0, 0).cuda(), mask.cuda()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--caches", default="dynamic,static")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    integration.register()
    models = {name: model(name, args.layers) for name in ("samattn", "sdpa")}
    models["samattn"].load_state_dict(models["sdpa"].state_dict())
    results = []
    for batch in map(int, args.batches.split(",")):
        ids, mask = prompts(batch, args.prompt)
        for cache in args.caches.split(","):
            options = {"max_new_tokens": args.new_tokens, "do_sample": False}
            if cache == "static":
                options["cache_implementation"] = "static"
            times: dict[str, list[float]] = {name: [] for name in models}
            tokens = {}
            with torch.no_grad():
                for name, m in models.items():  # warm-up (and the tokens compared)
                    tokens[name] = m.generate(ids, attention_mask=mask, **options)
                for _ in range(args.repeats):
                    for name, m in models.items():
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        m.generate(ids, attention_mask=mask, **options)
                        torch.cuda.synchronize()
                        times[name].append(time.perf_counter() - start)
            median = {name: statistics.median(t) for name, t in times.items()}
            same = (tokens["samattn"] == tokens["sdpa"]).float().mean().item()
            results.append({
                "batch": batch, "cache": cache, "prompt": args.prompt,
                "new_tokens": args.new_tokens, "layers": args.layers,
                "seconds": median, "runs": times,
                "tokens_per_s": {n: batch * args.new_tokens / s for n, s in median.items()},
                "speed_ratio": median["sdpa"] / median["samattn"],
                "same_tokens": same,
            })  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "results": results}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
