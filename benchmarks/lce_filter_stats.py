"""How much of the backward each gradient-filter rule skips on real hidden states, and how much mass it drops.

For inputs written by benchmarks/lce_real_inputs.py (CPU, float32 logits of the bf16 inputs, as the kernel
computes them), in the kernel's tiles (forward.TILES: 128 rows x 256 vocabulary entries), per rule: the share of
tiles skipped and the probability mass actually dropped per token (mean, 99th percentile, max). Rules (P_t =
exp(tile max of the non-target logits - smallest LSE of the row block) bounds every probability of the tile):
- exact: the kernel's default, P_t < 2^-10 / V (backward.FILTER_MASS);
- loose: the kernel's filter="loose", tiles of smallest w_t P_t skipped while their sum <= backward.LOOSE_MASS;
- loose@m: the same rule with budget m instead (what other budgets would give);
- loose-tile-lse: the loose rule on a tighter bound, exp(max over rows of the tile's log-sum-exp - smallest LSE),
  which a forward storing each tile's row log-sum-exp could use (not implemented);
- exact-row, loose-row: the exact and loose rules with P_t = max over the block's rows r of exp(the row's
  tile max - LSE_r), normalised per row instead of by the smallest LSE of the block;
- loose-row-tile-lse: the loose rule on max over rows of the tile's true mass (the tightest per-tile bound);
- cce: Cut Cross-Entropy's rule, every non-target probability of the tile < 2^-12 (no mass bound).
Each is also measured with the vocabulary sorted by mean logit over the batch (C @ mean_i E_i, descending): the
order a kernel could compute in its forward with one GEMV, so that likely tokens share tiles.

Usage (repo root, after lce_real_inputs.py):
    .venv/bin/python benchmarks/lce_filter_stats.py .gpu_lce/gemma3-270m .gpu_lce/smollm2-135m --out results/lce_filter_stats.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.lce_real_inputs import load  # noqa: E402
from kernels import backward, forward  # noqa: E402

CCE_EPS = 2.0**-12
OTHER_BUDGETS = (2.0**-10, 2.0**-6)


def _greedy_skip(tile_mass: torch.Tensor, budget: float) -> torch.Tensor:
    """(T,) bool: the tiles of smallest bound skipped while their bounds sum to <= budget."""
    order = tile_mass.argsort()
    skip = torch.zeros_like(tile_mass, dtype=torch.bool)
    skip[order] = tile_mass[order].cumsum(0) <= budget
    return skip


def block_rules(z: torch.Tensor, targets: torch.Tensor, vocab: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Skip masks (T,) per rule for one row block of float32 logits z (R, V) and the true non-target mass of
    each (row, tile) (R, T), float64."""
    bv = forward.TILES.block_v
    rows = z.shape[0]
    lse = z.logsumexp(dim=1)
    z = z.scatter(1, targets[:, None], float("-inf"))
    pad = (-vocab) % bv
    zt = torch.nn.functional.pad(z, (0, pad), value=float("-inf")).view(rows, -1, bv)
    row_max = zt.amax(dim=2)  # (R, T)
    row_tile_lse = zt.logsumexp(dim=2)
    mass = (row_tile_lse - lse[:, None]).double().exp()
    min_lse = lse.min()
    width = torch.full((zt.shape[1],), float(bv), dtype=torch.float64)
    width[-1] = bv - pad
    log_p = (row_max.amax(dim=0) - min_lse).double()
    bound = width * log_p.exp()
    tile_lse_bound = (row_tile_lse.amax(dim=0) - min_lse).double().exp()
    row_log_p = (row_max - lse[:, None]).amax(dim=0).double()  # per-row normalised: max_r log p of the tile
    rules = {
        "exact": log_p < math.log(backward.FILTER_MASS / vocab),
        "loose": _greedy_skip(bound, backward.LOOSE_MASS),
        **{f"loose@2^{int(math.log2(m))}": _greedy_skip(bound, m) for m in OTHER_BUDGETS},
        "loose-tile-lse": _greedy_skip(tile_lse_bound, backward.LOOSE_MASS),
        "exact-row": row_log_p < math.log(backward.FILTER_MASS / vocab),
        "loose-row": _greedy_skip(width * row_log_p.exp(), backward.LOOSE_MASS),
        "loose-row-tile-lse": _greedy_skip((row_tile_lse - lse[:, None]).amax(dim=0).double().exp(), backward.LOOSE_MASS),
        "cce": (row_max - lse[:, None]).amax(dim=0) < math.log(CCE_EPS),
    }
    return rules, mass


def measure(folder: str, n_limit: int | None) -> dict:
    hidden, weight, targets, facts = load(folder)
    if n_limit:
        hidden, targets = hidden[:n_limit], targets[:n_limit]
    e, c = hidden.float(), weight.float()
    vocab = c.shape[0]
    orders = {"natural": None, "sorted": (c @ e.mean(dim=0)).argsort(descending=True)}
    skipped: dict[tuple[str, str], list[torch.Tensor]] = {}
    dropped: dict[tuple[str, str], list[torch.Tensor]] = {}
    entropy, top_prob = [], []
    bn = forward.TILES.block_n
    for r0 in range(0, e.shape[0], bn):
        z = e[r0:r0 + bn] @ c.T
        y = targets[r0:r0 + bn]
        p = z.softmax(dim=1)
        entropy.append(z.logsumexp(dim=1) - (p * z).sum(dim=1))
        top_prob.append(p.amax(dim=1))
        del p
        for name, perm in orders.items():
            zo, yo = (z, y) if perm is None else (z[:, perm], perm.argsort()[y])
            rules, mass = block_rules(zo, yo, vocab)
            for rule, skip in rules.items():
                skipped.setdefault((name, rule), []).append(skip)
                dropped.setdefault((name, rule), []).append((mass * skip[None, :]).sum(dim=1))
        print(f"{facts['family']}: rows {r0 + bn} of {e.shape[0]}", end="\r", flush=True)
    ent, top = torch.cat(entropy), torch.cat(top_prob)
    rows = []
    for (order, rule), masks in skipped.items():
        d = torch.cat(dropped[(order, rule)])
        rows.append({
            "order": order, "rule": rule, "tiles skipped": torch.cat(masks).double().mean().item(),
            "dropped mean": d.mean().item(), "dropped p99": d.quantile(0.99).item(), "dropped max": d.max().item(),
        })
    return {
        "family": facts["family"], "n": e.shape[0], "vocab": vocab, "dim": c.shape[1],
        "mean entropy": ent.mean().item(), "median top prob": top.median().item(),
        "tiles": {"block_n": bn, "block_v": forward.TILES.block_v},
        "budgets": {"exact": backward.FILTER_MASS, "loose": backward.LOOSE_MASS, "cce eps": CCE_EPS},
        "facts": facts, "rows": rows,
    }


def print_table(result: dict) -> None:
    print(f"\n{result['family']}: N {result['n']}, V {result['vocab']}, D {result['dim']}, mean entropy "
          f"{result['mean entropy']:.2f} nats, median top prob {result['median top prob']:.2f}")
    print("| vocabulary | rule | tiles skipped | dropped mass / token: mean | p99 | max |")
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['order']} | {r['rule']} | {100 * r['tiles skipped']:.1f}% | {r['dropped mean']:.2e} | "
              f"{r['dropped p99']:.2e} | {r['dropped max']:.2e} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", help="folders written by lce_real_inputs.py")
    p.add_argument("--n", type=int, help="first N tokens only")
    p.add_argument("--out", help="JSON file to write")
    args = p.parse_args()
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
