"""Masks kept at one bit an entry (sparse_dist.bit_mask), and the grid layers that keep them: the same bits come
back, on numpy's path and torch's, a grid layer's backward lets its aggregation go, and its aggregation product
makes one block."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparse_dist import bit_mask
from sparse_dist.bit_mask import PackedMask, fresh_gradient, masked_gradient, pack_with_shifts, unpack_with_shifts
from sparse_dist.comm import world
from sparse_dist.grid import GridShape, ProcessGrid
from sparse_dist.grid_gcn import GridReLU, adjacency_blocks, gcn_layer, sparse_product
from sparse_dist.grid_links import GridLinks


@pytest.mark.parametrize("numel", [0, 1, 7, 8, 9, 63, 1000, 4097])
def test_a_packed_mask_unpacks_to_the_same_bits_on_both_paths(numel: int) -> None:
    mask = torch.from_numpy(np.random.default_rng(numel).random(numel) < 0.3)
    packed = PackedMask.of(mask)
    assert packed.bits.dtype == torch.uint8 and packed.bits.numel() == -(-numel // 8)
    assert torch.equal(packed.unpack(), mask)
    assert torch.equal(pack_with_shifts(mask), packed.bits)  # torch's shifts (other devices) lay bits out alike
    assert torch.equal(unpack_with_shifts(packed.bits, numel), mask)


def test_a_mask_of_any_shape_and_stride_comes_back_in_its_shape() -> None:
    mask = torch.from_numpy(np.random.default_rng(3).random((37, 5)) < 0.5)
    for view in (mask, mask.T, mask[::2]):
        assert torch.equal(PackedMask.of(view).unpack(), view)
    with pytest.raises(TypeError, match="boolean"):
        PackedMask.of(torch.ones(3))


@pytest.mark.parametrize("numel", [0, 5, 16, 40, 1001])
def test_a_mask_multiplies_in_place_piece_by_piece_as_the_whole_mask_would(monkeypatch: pytest.MonkeyPatch,
                                                                          numel: int) -> None:
    """In pieces of 16 entries (a piece ending mid-byte included), the same values as ``values * mask``: zeros
    signed as the product signs them, NaN kept where the mask keeps it; a gradient inside a graph, or a view, is
    masked on a copy."""
    monkeypatch.setattr(bit_mask, "PIECE", 16)
    rng = np.random.default_rng(numel)
    mask = torch.from_numpy(rng.random(numel) < 0.5)
    values = torch.from_numpy(rng.standard_normal(numel))
    if numel:
        values[0] = float("nan")
    expected = values * mask
    packed = PackedMask.of(mask)
    same = packed.multiply_(values)
    assert same is values and torch.equal(values.isnan(), expected.isnan())
    assert torch.equal(torch.nan_to_num(values), torch.nan_to_num(expected))
    assert torch.equal(torch.signbit(values), torch.signbit(expected))
    grad = torch.randn(numel, requires_grad=True)
    assert masked_gradient(packed, grad) is not grad and torch.equal(grad.detach() * mask,
                                                                     masked_gradient(packed, grad).detach())
    with pytest.raises(ValueError, match="contiguous tensor of its shape"):
        PackedMask.of(torch.ones(4, 3, dtype=torch.bool)).multiply_(torch.ones(3, 4).T)


def test_grid_relu_keeps_bits_and_its_gradient_is_the_masks() -> None:
    h = torch.randn(33, 7, dtype=torch.float64, requires_grad=True)
    out = GridReLU.apply(h.clone())
    assert out.grad_fn.positive.bits.numel() == -(-33 * 7 // 8)
    grad = torch.randn(33, 7, dtype=torch.float64)
    handed = grad.clone()
    out.backward(handed)
    assert torch.equal(h.grad, grad * (h.detach() > 0))
    assert torch.equal(handed, grad)  # a gradient a caller hands to backward() is not masked in place


def test_a_fresh_gradient_is_masked_in_place_behind_the_layer_that_made_it() -> None:
    """The grid layers mark the input gradient they return (fresh_gradient); the ReLU behind masks that very
    tensor, so no second block stands beside it."""
    made = []

    class Next(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return h.sum(dim=1, keepdim=True)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            made.append(fresh_gradient(grad.expand(-1, 7).contiguous().clone()))
            return made[-1]

    h = torch.randn(33, 7, dtype=torch.float64, requires_grad=True)
    relu_out = GridReLU.apply(h * 1.0)
    Next.apply(relu_out).sum().backward()
    assert torch.equal(made[0], (h.detach() > 0).double())  # ones masked where the ReLU cut, in place
    assert torch.equal(h.grad, made[0])


def test_a_grid_layer_lets_its_aggregation_go_after_the_weights_gradient_and_refuses_a_second_backward() -> None:
    comm = world(gpu_aware="off")
    grid = ProcessGrid(comm, GridShape(1, 1, 1))
    try:
        matrix = sp.random(20, 20, density=0.2, random_state=1, format="csr")
        block = adjacency_blocks(grid, matrix, 2, torch.float64)[1]
        h = torch.randn(20, 4, dtype=torch.float64, requires_grad=True)
        weight = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
        bias = torch.zeros(3, dtype=torch.float64, requires_grad=True)
        out = gcn_layer(h, (weight, bias), block, GridLinks(grid, 1), True, None)
        node = out.grad_fn
        assert node.aggregated is not None
        out.sum().backward(retain_graph=True)
        dense = torch.from_numpy(matrix.toarray())
        assert torch.allclose(weight.grad, (dense @ h.detach()).T @ torch.ones(20, 3, dtype=torch.float64))
        assert torch.allclose(h.grad, dense.T @ torch.ones(20, 3, dtype=torch.float64) @ weight.detach().T)
        assert node.aggregated is None
        with pytest.raises(RuntimeError, match="runs once per forward"):
            out.sum().backward()
    finally:
        grid.free()
        comm.free()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,cols,width", [(300, 200, 17), (0, 5, 3), (4, 0, 3), (6, 5, 0)])
def test_a_grid_blocks_product_gives_torchs_bits_into_one_fresh_block(dtype: torch.dtype, rows: int, cols: int,
                                                                      width: int) -> None:
    """The grid's aggregation product (addmm into a fresh block, beta 0) equals ``torch.sparse.mm`` bit for bit,
    empty blocks too; it relies on addmm with beta 0 ignoring what the block held, NaN included (checked here)."""
    rng = np.random.default_rng(rows + width)
    dense = sp.random(rows, cols, density=0.1, random_state=rng, format="csr")
    matrix = torch.sparse_csr_tensor(torch.from_numpy(dense.indptr.astype(np.int64)),
                                     torch.from_numpy(dense.indices.astype(np.int64)),
                                     torch.from_numpy(dense.data).to(dtype), size=(rows, cols))
    h = torch.from_numpy(rng.standard_normal((cols, width))).to(dtype)
    expected = torch.sparse.mm(matrix, h) if rows and cols else torch.zeros(rows, width, dtype=dtype)
    out = sparse_product(matrix, h)
    assert out.shape == (rows, width) and out.is_contiguous() and torch.equal(out, expected)
    if rows and cols:
        poisoned = torch.full((rows, width), float("nan"), dtype=dtype)
        assert torch.equal(torch.addmm(poisoned, matrix, h, beta=0, out=poisoned), expected)
