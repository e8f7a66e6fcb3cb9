"""The dense backward's chunk schedule (kernels.backward.dense_chunks): pure arithmetic, no kernels."""

from __future__ import annotations

import pytest
import triton

from kernels import backward, forward


@pytest.mark.parametrize(("n", "vocab", "d"), [(8192, 256000, 2304), (8192, 262144, 640), (8192, 49152, 576),
                                               (1000, 50000, 520), (300, 700, 40), (1, 300, 64)])
@pytest.mark.parametrize("has_dc", [True, False])
def test_chunks_cover_the_vocabulary_and_dz_never_meets_written_dc(n: int, vocab: int, d: int, has_dc: bool) -> None:
    chunks = backward.dense_chunks(n, vocab, d, 2, True, has_dc)
    padded = triton.cdiv(n, forward.TILES.block_n) * forward.TILES.block_n
    ded_rows, ded_vocab = backward.chunk_shape(padded // forward.TILES.block_n, triton.cdiv(vocab, 256), d, n, 2, True)
    assert chunks[0].c0 == 0 and chunks[-1].c0 + chunks[-1].vc == vocab
    assert all(a.c0 + a.vc == b.c0 for a, b in zip(chunks, chunks[1:]))
    in_dc = [c for c in chunks if c.workspace is not None]
    assert chunks[: len(in_dc)] == in_dc  # the chunks in dC's storage come first
    for c in in_dc:
        tile = backward.TILES.dz_block_v
        assert c.rows == padded and c.vc % tile == 0 and c.vc <= backward.TILES.workspace_vocab
        assert c.vc * padded > ded_rows * ded_vocab  # larger than the dedicated chunk
        # dZ (padded rows x vc, whole tiles) lies behind the rows of dC written so far, inside dC, 128-byte aligned
        assert c.workspace >= (c.c0 + c.vc) * d and c.workspace + padded * c.vc <= vocab * d
        assert c.workspace % backward.WORKSPACE_ALIGN == 0
    assert [c.vc for c in in_dc] == sorted((c.vc for c in in_dc), reverse=True)
    for c in chunks[len(in_dc):]:
        assert c.rows == ded_rows and c.vc <= ded_vocab
    if not has_dc:
        assert not in_dc


def test_paper_shape_reads_the_de_accumulator_far_less_often() -> None:
    """N = 8192, V = 256000, D = 2304 (bf16): dE's float32 accumulator is read and written once per (chunk, row
    chunk); the dedicated 8192 x 4096 chunks alone take 63 of them, dC's storage brings it under 30."""
    n, vocab, d = 8192, 256000, 2304
    passes = sum(triton.cdiv(n, c.rows) for c in backward.dense_chunks(n, vocab, d, 2, True, True))
    dedicated = sum(triton.cdiv(n, c.rows) for c in backward.dense_chunks(n, vocab, d, 2, True, False))
    assert dedicated == 63 and passes < 30


@pytest.mark.parametrize(("n", "vocab", "d", "expected"), [
    (8192, 256000, 2304, 8), (8192, 128256, 2048, 3), (4096, 128256, 2048, 7), (1000, 50000, 1024, 5),
    (8192, 262144, 640, 0), (8192, 49152, 576, 0), (300, 700, 40, 0),
])
def test_kept_logit_chunks_lie_past_the_dc_rows_written_before_their_use(n: int, vocab: int, d: int,
                                                                          expected: int) -> None:
    """forward.kept_chunks: J chunks of w = 8192 leading positions, chunk j at V d - (J - j) w n in dC's storage,
    never under the dC rows [0, (j + 1) w) the backward has written when it is done with chunk j (each chunk's
    GEMMs write its own rows while they read it); one chunk more would break that (or pass the vocabulary). The
    paper's shape keeps 65536 positions (26%); below D = 1024 (Gemma-3-270M's 640, SmolLM2-135M's 576) nothing is
    kept, as recomputing costs less there than the traffic."""
    w = forward.TILES.keep_vocab
    chunks = forward.kept_chunks(n, vocab, d)
    assert chunks == expected

    def fits(count: int) -> bool:
        return count * w <= vocab and all(vocab * d - (count - j) * w * n >= (j + 1) * w * d for j in range(count))

    if d >= forward.TILES.keep_min_dim:
        assert fits(chunks) and not fits(chunks + 1)
    # after them the dense chunks start where the kept ones stopped and cover the rest
    rest = backward.dense_chunks(n, vocab, d, 2, True, True, chunks * w)
    assert rest[0].c0 == chunks * w and rest[-1].c0 + rest[-1].vc == vocab
    for c in rest:
        if c.workspace is not None:
            assert c.workspace >= (c.c0 + c.vc) * d
