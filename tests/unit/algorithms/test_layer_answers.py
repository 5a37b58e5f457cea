"""What a layer kind answers the estimators from the flags alone (its widths, parameters, exchanges) is what the
model it builds holds and moves, for every built-in kind and for options that change the widths."""

from __future__ import annotations

import pytest

from algorithms.layers import LayerOptions
from algorithms.model import GraphModel, layer_figures


@pytest.mark.parametrize("kind,options", [("gcn", LayerOptions()), ("sage", LayerOptions()),
                                          ("gat", LayerOptions()), ("gat", LayerOptions(heads=3, output_heads=2))])
@pytest.mark.parametrize("dims", [[12, 16, 4], [5, 5, 9, 3], [100, 8]])
def test_the_answers_are_what_the_built_model_holds(kind: str, options: LayerOptions, dims: list[int]) -> None:
    model = GraphModel(kind, dims, options=options)
    figures = layer_figures(kind, dims, options)
    assert [f.fan_in for f in figures] == [layer.fan_in for layer in model.layers]
    assert [f.width for f in figures] == [layer.fan_out for layer in model.layers] == model.widths[1:]
    assert [f.parameters for f in figures] == [sum(p.numel() for p in layer.parameters()) for layer in model.layers]
    assert [f.owner for f in figures] == [layer.exchange_shape(False) for layer in model.layers]
    assert [f.receiver for f in figures] == [layer.exchange_shape(True) for layer in model.layers]


def test_an_spmm_layer_exchanges_the_narrower_side_and_attention_its_terms() -> None:
    gcn = layer_figures("gcn", [100, 16, 7])
    assert [f.owner for f in gcn] == [(16, True), (7, True)] and [f.receiver for f in gcn] == [(100, False), (16, False)]
    assert [f.dense_work for f in layer_figures("sage", [100, 16, 7])] == [2 * 100 * 16, 2 * 16 * 7]
    gat = layer_figures("gat", [100, 16, 7], LayerOptions(heads=4, output_heads=2))
    assert [f.owner for f in gat] == [(4 * 16 + 4, True), (2 * 7 + 2, True)]
    assert [f.edge_values for f in gat] == [24, 12] and {f.edge_values for f in gcn} == {0}
