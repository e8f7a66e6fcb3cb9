"""How much of the backward the gradient filters skip on real hidden states, and how much mass they drop.

For inputs written by benchmarks/lce_real_inputs.py (CPU, float32 logits of the bf16 inputs, as the kernel computes
them), the per-token log-sum-exp of each 256-wide tile of the vocabulary sorted by mean logit (what the forward
stores with a filter), then kernels.filter.plan itself at several budgets: the share of (128-row block x tile)
products the backward computes, the work of the dense pieces it runs them in and their number (kernels.filter.pieces
at the backward's buffer sizes), and the probability mass actually dropped per token (mean, 99th percentile, max).
Rows: the budgets of filter="exact" (2^-10) and "loose" (2^-8) and a larger one, with the tokens in the plan's order
and, for comparison, in their natural order (blocks of consecutive tokens: what sorting the tokens gains); and Cut
Cross-Entropy's rule (skip a tile when every probability of its rows is < 2^-12, no bound on the sum) on the same
tiles.

Usage (repo root, after lce_real_inputs.py):
    .venv/bin/python benchmarks/lce_filter_stats.py .gpu_lce/gemma3-270m .gpu_lce/smollm2-135m \
        --out kernels/filter_stats_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.lce_real_inputs import load  # noqa: E402
from kernels import filter as lce_filter  # noqa: E402
from kernels import backward, forward  # noqa: E402

CCE_EPS = 2.0**-12
BUDGETS = (2.0**-10, lce_filter.FILTER_MASS["loose"], 2.0**-6)


def tile_statistics(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per token: LSE, entropy, top probability; per (tile, token): the log-sum-exp of the tile's non-target
    logits (sorted vocabulary, padded to whole row blocks with -inf) and the tile's largest non-target logit."""
    e, c = hidden.float(), weight.float()
    order = (c @ e.mean(dim=0)).argsort(descending=True)
    c, y = c[order], order.argsort()[targets.clamp_min(0)]
    bn, bv = forward.TILES.block_n, forward.TILES.block_v
    n, vocab = e.shape[0], c.shape[0]
    tiles, padded = -(-vocab // bv), -(-n // bn) * bn
    tile_lse = torch.full((tiles, padded), float("-inf"))
    tile_max = torch.full((tiles, padded), float("-inf"))
    lse, entropy, top = torch.empty(n), torch.empty(n), torch.empty(n)
    for r0 in range(0, n, bn):
        z = e[r0 : r0 + bn] @ c.T
        rows = slice(r0, r0 + z.shape[0])
        lse[rows] = z.logsumexp(dim=1)
        p = z.softmax(dim=1)
        entropy[rows], top[rows] = lse[rows] - (p * z).sum(dim=1), p.amax(dim=1)
        z = z.scatter(1, y[rows, None], float("-inf"))
        zt = torch.nn.functional.pad(z, (0, tiles * bv - vocab), value=float("-inf")).view(z.shape[0], tiles, bv)
        tile_lse[:, rows], tile_max[:, rows] = zt.logsumexp(dim=2).T, zt.amax(dim=2).T
        print(f"rows {r0 + z.shape[0]} of {n}", end="\r", flush=True)
    return {"lse": lse, "entropy": entropy, "top": top, "tile_lse": tile_lse, "tile_max": tile_max}


def _rule_name(budget: float) -> str:
    """'2^-10 (exact)' for a filter's budget, '2^-6' for others."""
    names = [f for f, mass in lce_filter.FILTER_MASS.items() if mass == budget]
    return f"2^{int(torch.log2(torch.tensor(budget)))}" + (f" ({names[0]})" if names else "")


def _dropped(stats: dict[str, torch.Tensor], kept_per_token: torch.Tensor) -> torch.Tensor:
    """Probability mass per token in the tiles at or after its kept count."""
    mass = (stats["tile_lse"][:, : kept_per_token.numel()] - stats["lse"]).double().exp()
    beyond = torch.arange(mass.shape[0])[:, None] >= kept_per_token[None, :]
    return torch.where(beyond, mass, 0.0).sum(dim=0)


def measure(folder: str, n_limit: int | None) -> dict:
    hidden, weight, targets, facts = load(folder)
    if n_limit:
        hidden, targets = hidden[:n_limit], targets[:n_limit]
    stats = tile_statistics(hidden, weight, targets)
    n, bn = targets.numel(), forward.TILES.block_n
    tiles, padded = stats["tile_lse"].shape
    valid = targets != -100
    rows_out = []
    for budget in BUDGETS:
        for order in ("sorted tokens", "natural tokens"):
            if order == "sorted tokens":
                rows, kept = lce_filter.plan(stats["tile_lse"].clone(), stats["lse"], valid, bn, budget)
            else:  # the same rule on blocks of consecutive tokens
                rows = torch.arange(padded)
                m = lce_filter.token_tile_mass(stats["tile_lse"].clone(), stats["lse"], valid)
                kept = lce_filter.kept_tiles(m.view(tiles, -1, bn).amax(dim=2), budget)
            per_token = lce_filter.kept_per_token(rows, kept, n, bn)
            budget_of_pieces = backward.piece_budget(padded, weight.shape[0], weight.shape[1], 2, True)
            pieces = lce_filter.pieces(kept.sort().values.tolist(), bn, *budget_of_pieces, forward.TILES.block_v)
            work = sum((r1 - r0) * (t1 - t0) for t0, t1, r0, r1 in pieces) / bn
            d = _dropped(stats, per_token)[valid]
            rows_out.append({
                "rule": _rule_name(budget), "tokens": order,
                "tiles computed": lce_filter.kept_share(kept, tiles), "piece work": work / (tiles * padded / bn),
                "pieces": len(pieces),
                "dropped mean": d.mean().item(), "dropped p99": d.quantile(0.99).item(), "dropped max": d.max().item(),
            })
    skip = (stats["tile_max"] - torch.nn.functional.pad(stats["lse"], (0, padded - n), value=float("inf")))
    cce_skip = (skip.view(tiles, -1, bn).amax(dim=2) < torch.log(torch.tensor(CCE_EPS)))  # (tiles, blocks)
    cce_kept = ~cce_skip.T.repeat_interleave(bn, dim=0)[:n]  # (tokens, tiles)
    mass = (stats["tile_lse"][:, :n] - stats["lse"]).double().exp().T
    d = torch.where(cce_kept, 0.0, mass).sum(dim=1)[valid]
    rows_out.append({"rule": "CCE (every p < 2^-12)", "tokens": "natural tokens",
                     "tiles computed": 1.0 - cce_skip.double().mean().item(), "piece work": None, "pieces": None,
                     "dropped mean": d.mean().item(), "dropped p99": d.quantile(0.99).item(),
                     "dropped max": d.max().item()})
    return {
        "family": facts["family"], "n": n, "vocab": weight.shape[0], "dim": weight.shape[1],
        "mean entropy": stats["entropy"].mean().item(), "median top prob": stats["top"].median().item(),
        "tiles": {"block_n": bn, "block_v": forward.TILES.block_v}, "vocabulary": "sorted by mean logit",
        "facts": facts, "rows": rows_out,
    }


def print_table(result: dict) -> None:
    print(f"\n{result['family']}: N {result['n']}, V {result['vocab']}, D {result['dim']}, mean entropy "
          f"{result['mean entropy']:.2f} nats, median top prob {result['median top prob']:.2f}")
    print("| rule | tokens | tiles computed | piece work | pieces | dropped mass / token: mean | p99 | max |")
    print("|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        work = "-" if r["piece work"] is None else f"{100 * r['piece work']:.1f}%"
        print(f"| {r['rule']} | {r['tokens']} | {100 * r['tiles computed']:.1f}% | {work} | {r['pieces'] or '-'} | "
              f"{r['dropped mean']:.2e} | {r['dropped p99']:.2e} | {r['dropped max']:.2e} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", help="folders written by lce_real_inputs.py")
    p.add_argument("--n", type=int, help="first N tokens only")
    p.add_argument("--out", help="JSON file to write")
    args = p.parse_args(argv)
    results = []
    with torch.no_grad():
        for folder in args.folders:
            results.append(measure(folder, args.n))
            print_table(results[-1])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
