"""Layer 0's input fetched once (halo) and receiver-side dropout: the decision, the masks, the byte model.
Exactness against the single-process reference and counted == predicted bytes under mpiexec run in
tests/mpi/test_training_cases.py (tests/mpi/cases/static_input_cases.py)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from datasets_for_tests import cora, write
from mpirun import BIN, run_mpi

from algorithms.dropout import keep_mask, keep_mask_rows
from algorithms.policies import AxisSpec
from algorithms.static_input import (HaloBudgetError, choose_input_exchange, evaluations, exchange_widths,
                                     parse_byte_size, receiver_side)
from runners.perf.cost_model import ModelShape
from sparse_dist.layout import Grid, RowLayout


@pytest.mark.parametrize("form", ["auto", "torch"])
def test_masks_of_scattered_rows_equal_the_rows_of_a_contiguous_mask(form: str) -> None:
    width = 37
    whole = keep_mask(5, 2, 3, 0, 300, width, 0.4, form=form)
    rows = np.array([299, 0, 17, 17, 150, 42, 43, 44, 120])  # any order, repeats, several chunks
    got = keep_mask_rows(5, 2, 3, rows, width, 0.4, form=form)
    assert torch.equal(got, whole[rows])
    own_then_halo = np.concatenate([np.arange(10, 30), [40, 45, 290, 291]])  # the layout of a halo input
    assert torch.equal(keep_mask_rows(5, 2, 3, own_then_halo, width, 0.4, form=form), whole[own_then_halo])
    assert keep_mask_rows(5, 2, 3, np.empty(0, np.int64), width, 0.4).shape == (0, width)


def test_byte_sizes_parse_in_powers_of_1024() -> None:
    assert parse_byte_size("4096") == 4096
    assert parse_byte_size("512K") == 512 * 1024
    assert parse_byte_size("1.5G") == 3 * 2**29
    assert parse_byte_size("2GiB") == 2 * 2**30
    assert parse_byte_size("unlimited") is None
    with pytest.raises(ValueError, match="expected a size such as 512M"):
        parse_byte_size("12Q")


def test_evaluations_and_dropout_side() -> None:
    assert evaluations(200, 1) == 200
    assert evaluations(10, 3) == 4  # epochs 3, 6, 9 and the last
    assert evaluations(0, 1) == 0
    none, sancus = AxisSpec.parse("stale", "none"), AxisSpec.parse("stale", "sancus-h:eps=0.1")
    assert not receiver_side("auto", 0.5, none)
    assert receiver_side("auto", 0.5, sancus)
    assert not receiver_side("auto", 0.0, sancus)  # no dropout: nothing to move to the receiver
    assert not receiver_side("auto", 0.5, AxisSpec.parse("stale", "sancus-e:eps=1"))  # looks at epochs only
    assert receiver_side("receiver", 0.5, none) and not receiver_side("owner", 0.5, sancus)


def test_auto_dropout_side_never_widens_an_exchange() -> None:
    """auto goes receiver-side under sancus-h only where no exchanging layer then sends more columns
    (sancus-h's skip share is data dependent: none is assumed)."""
    sancus = AxisSpec.parse("stale", "sancus-h:eps=0.05")
    issue = exchange_widths([(64, 64), (64, 4)], "auto")  # 64 features -> 64 hidden -> 4 classes
    assert issue == [(64, 64), (64, 4)]
    assert not receiver_side("auto", 0.5, sancus, issue)  # layer 1 would send 64 columns instead of 4
    assert receiver_side("receiver", 0.5, sancus, issue)  # asked for: kept
    widening = exchange_widths([(12, 64), (64, 64), (64, 64)], "per-epoch")
    assert receiver_side("auto", 0.5, sancus, widening)  # equal or narrower everywhere
    # layer 0 counts unless it never exchanges; a layer that says its widths (attention) is taken at its word
    assert not receiver_side("auto", 0.5, sancus, exchange_widths([(1433, 64), (64, 64)], "auto"))
    assert receiver_side("auto", 0.5, sancus, exchange_widths([(1433, 64), (64, 64)], "once"))
    assert exchange_widths([(8, 16), (16, 4)], "auto", [None, (16, 20)]) == [(8, 8), (16, 20)]


def _choose(requested: str, epochs: int, budget: int | None = None):
    # Two row groups: group 0 needs 3 rows of group 1, group 1 needs 5 rows of group 0; F: 100 -> 10.
    counts = np.array([[0, 3], [5, 0]])
    return choose_input_exchange(requested, grid=Grid(2, 1), layout=RowLayout.from_counts([10, 12]),
                                 boundary_counts=counts, union_sizes=np.array([5, 3]), plan="p2p", f_in=100, f_out=10,
                                 itemsize=4, epochs=epochs, evaluations=epochs, budget=budget)


def test_the_byte_model_picks_the_cheaper_way_to_feed_layer_0() -> None:
    # once: 8 rows x 100 x 4 B = 3200 B. Per epoch: 8 rows x 10 x 4 B forward and backward, plus a forward
    # per evaluation: 960 B an epoch.
    four = _choose("auto", 4)
    assert (four.once_bytes, four.per_epoch_run_bytes, four.mode) == (3200, 3840, "once")
    assert four.halo_rows == [3, 5] and four.halo_bytes == [1200, 2000]
    three = _choose("auto", 3)
    assert (three.per_epoch_run_bytes, three.mode) == (2880, "per-epoch")
    assert _choose("once", 3).mode == "once" and _choose("per-epoch", 4).mode == "per-epoch"
    assert "once" in four.describe() and "3200" not in four.describe()  # figures in MiB


def test_a_halo_over_budget_is_refused_or_avoided() -> None:
    with pytest.raises(HaloBudgetError, match="row group 1 would keep 5 halo rows"):
        _choose("once", 4, budget=1500)
    fallback = _choose("auto", 4, budget=1500)
    assert fallback.mode == "per-epoch" and "budget" in fallback.reason
    assert _choose("once", 4, budget=2000).mode == "once"


def test_model_shape_leaves_out_layer_0_when_it_reads_its_halo() -> None:
    assert ModelShape((100, 16, 7)).exchanges == [(16, True), (7, True)]
    assert ModelShape((100, 16, 7), input_once=True).exchanges == [(7, True)]
    assert ModelShape((100, 16, 7), receiver_dropout=True).exchanges == [(100, False), (16, True)]
    assert ModelShape((100, 16, 7), input_once=True, receiver_dropout=True).exchanges == [(16, True)]
    assert ModelShape((8, 16, 7)).exchanges == [(8, False), (7, True)]
    assert ModelShape((100, 16, 7), input_once=True).spmm_passes == ModelShape((100, 16, 7)).spmm_passes


def test_a_halo_over_budget_ends_the_run_with_one_sentence(tmp_path: Path) -> None:
    data = write(cora(), tmp_path / "cora", parts=2)
    base = [str(BIN / "sparse-dist"), "train", "--data", str(data), "--epochs", "2"]
    refused = run_mpi(2, base + ["--input-exchange", "once", "--halo-budget", "1M"], timeout=120)
    assert refused.returncode != 0
    assert refused.stderr.count("more than --halo-budget 1.000 MiB") == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    fallback = run_mpi(2, base + ["--halo-budget", "1M", "--print-every", "1000"], timeout=120)
    assert fallback.returncode == 0, fallback.stderr
    assert "layer-0 input: per-epoch (the halo does not fit --halo-budget)" in fallback.stdout
