"""entropy_floor_stats on a tiny random model against a float64 truth that materialises every logit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from calibration.entropy.bound import entropy_floor
from calibration.entropy.statistics import STATS, entropy_floor_stats

VOCAB, HIDDEN = 300, 32


@pytest.fixture(scope="module")
def head_and_hidden() -> tuple[torch.Tensor, torch.Tensor]:
    """A 1-layer random Llama's head (|V|, D) and the final (post-norm) hidden states of 2 x 37 tokens."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        hidden = model.model(torch.randint(0, VOCAB, (2, 37))).last_hidden_state
    return model.lm_head.weight.detach(), hidden


def _truth(weight: torch.Tensor, hidden: torch.Tensor, softcap: float | None = None) -> dict[str, float]:
    """Every statistic from the full float64 logits, torch's SVD and numpy's nearest-rank percentile."""
    w, h = weight.double(), hidden.double().reshape(-1, weight.shape[1])
    logits = h @ w.T
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    log_p = torch.log_softmax(logits, dim=-1)
    sigma_c = float(torch.linalg.matrix_norm(w, ord=2))
    magnitude = h.abs().numpy().ravel()
    rho = sigma_c * float(magnitude.max())
    return {"sigma_c": sigma_c, "sigma_h_max": float(magnitude.max()),
            "sigma_h_p999": float(np.percentile(magnitude, 99.9, method="inverted_cdf")), "rho": rho,
            "entropy_floor": float(entropy_floor(w.shape[0], w.shape[1], rho)),
            "mean_entropy": float(-(log_p.exp() * log_p).sum(-1).mean())}


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 1e-5)])
@pytest.mark.parametrize("chunk_elements", [1 << 24, 7 * VOCAB])  # one chunk; 7-row chunks (74 rows: a ragged end)
def test_statistics_match_the_float64_truth(head_and_hidden, dtype, rtol, chunk_elements):
    weight, hidden = (t.to(dtype) for t in head_and_hidden)
    stats = entropy_floor_stats(weight, hidden, chunk_elements=chunk_elements)
    truth = _truth(weight, hidden)  # of the same (rounded) inputs: the error is the computation's only
    assert tuple(stats) == STATS and all(isinstance(v, float) for v in stats.values())
    for name in STATS:
        assert stats[name] == pytest.approx(truth[name], rel=rtol if name == "mean_entropy" else 1e-12), name
    assert stats["mean_entropy"] >= stats["entropy_floor"]


def test_soft_capped_logits(head_and_hidden):
    weight, hidden = head_and_hidden
    stats = entropy_floor_stats(weight, 40 * hidden, softcap=2.0)
    assert stats["mean_entropy"] == pytest.approx(_truth(weight, 40 * hidden, softcap=2.0)["mean_entropy"], rel=1e-5)
    assert stats["mean_entropy"] > entropy_floor_stats(weight, 40 * hidden)["mean_entropy"]  # capping spreads p


def test_no_token_goes_below_a_floor_that_bites(head_and_hidden):
    """Small hidden states make the floor large; each token's float64 entropy still lies above it."""
    weight, hidden = (t.double() for t in head_and_hidden)
    small = 0.02 * hidden
    stats = entropy_floor_stats(weight, small)
    assert 0.5 * np.log(VOCAB) < stats["entropy_floor"] < np.log(VOCAB)
    log_p = torch.log_softmax(small.reshape(-1, HIDDEN) @ weight.T, dim=-1)
    assert float((-(log_p.exp() * log_p).sum(-1)).min()) >= stats["entropy_floor"]


@pytest.mark.parametrize("weight,hidden,kwargs,match", [
    (torch.ones(1, 4), torch.ones(3, 4), {}, "head_weight of shape"),
    (torch.ones(5, 4), torch.ones(3, 2), {}, r"hidden of shape \(\.\.\., 4\)"),
    (torch.ones(5, 4), torch.ones(0, 4), {}, "at least one state"),
    (torch.ones(5, 4, dtype=torch.int64), torch.ones(3, 4), {}, "floating head_weight"),
    (torch.ones(5, 4), torch.ones(3, 4), {"softcap": 0.0}, "softcap None or > 0"),
])
def test_bad_inputs_are_one_line_errors(weight, hidden, kwargs, match):
    with pytest.raises(ValueError, match=match):
        entropy_floor_stats(weight, hidden, **kwargs)
