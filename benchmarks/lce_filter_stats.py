"""How much of the backward each gradient-filter rule skips on real hidden states, and how much mass it drops.

For inputs written by benchmarks/lce_real_inputs.py (CPU, float32 logits of the bf16 inputs, as the kernel
computes them), in the kernel's tiles (forward.TILES: 128 rows x 256 vocabulary entries), per rule: the share of
tiles skipped and the probability mass actually dropped per token (mean, 99th percentile, max). Rules:
- exact: the kernel's default: P_t = exp(tile max of the non-target logits - smallest LSE of the row block)
  < 2^-10 / V (backward.FILTER_MASS);
- loose: the rule of the kernel's filter="loose": of the tiles exact keeps, those of smallest M_t = max over the
  block's rows of the tile's non-target mass are skipped while their sum <= LOOSE_MASS - FILTER_MASS (2^-8 in
  all);
- loose@2^k: the same rule with 2^k in all instead (what other budgets would give);
- cce: Cut Cross-Entropy's rule, every non-target probability of the tile < 2^-12 (no bound on the sum).
Each is measured in the natural vocabulary order and sorted by mean logit over the batch (C @ mean_i E_i,
descending), the order filter="loose" walks (so "sorted loose" is what the kernel does).

Usage (repo root, after lce_real_inputs.py):
    .venv/bin/python benchmarks/lce_filter_stats.py .gpu_lce/gemma3-270m .gpu_lce/smollm2-135m \
        --out kernels/filter_stats_cpu.json
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
OTHER_BUDGETS = (2.0**-6, 2.0**-4)


def _loose_skip(exact_skip: torch.Tensor, tile_mass: torch.Tensor, total: float) -> torch.Tensor:
    """(T,) bool: exact's skips, then the tiles of smallest mass while their sum <= total - FILTER_MASS."""
    mass = torch.where(exact_skip, 0.0, tile_mass)
    order = mass.argsort()
    skip = torch.zeros_like(exact_skip)
    skip[order] = mass[order].cumsum(0) <= total - backward.FILTER_MASS
    return skip


def block_rules(z: torch.Tensor, targets: torch.Tensor, vocab: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Skip masks (T,) per rule for one row block of float32 logits z (R, V) and the true non-target mass of
    each (row, tile) (R, T), float64."""
    bv = forward.TILES.block_v
    rows = z.shape[0]
    lse = z.logsumexp(dim=1)
    z = z.scatter(1, targets[:, None], float("-inf"))
    zt = torch.nn.functional.pad(z, (0, (-vocab) % bv), value=float("-inf")).view(rows, -1, bv)
    row_max = zt.amax(dim=2)  # (R, T)
    mass = (zt.logsumexp(dim=2) - lse[:, None]).double().exp()
    exact = (row_max.amax(dim=0) - lse.min()).double() < math.log(backward.FILTER_MASS / vocab)
    tile_mass = mass.amax(dim=0)
    return {
        "exact": exact,
        "loose": _loose_skip(exact, tile_mass, backward.LOOSE_MASS),
        **{f"loose@2^{int(math.log2(m))}": _loose_skip(exact, tile_mass, m) for m in OTHER_BUDGETS},
        "cce": (row_max - lse[:, None]).amax(dim=0) < math.log(CCE_EPS),
    }, mass


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
