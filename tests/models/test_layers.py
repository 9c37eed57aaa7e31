"""Layer identity as data (isoprobe.models.layers): the names records use, depth in a stack,
and the parse back from a name."""

import pytest

from isoprobe.models.layers import Layer, is_block, parse_layer, stack_layers


def test_the_layers_of_stacks_are_embed_then_each_stacks_blocks_with_their_depth():
    layers = stack_layers({"encoder": 3, "decoder": 1})
    assert [layer.name for layer in layers] == [
        "embed",
        "encoder.0",
        "encoder.1",
        "encoder.2",
        "decoder.0",
    ]
    assert [layer.depth for layer in layers] == [0.0, 0.0, 0.5, 1.0, 0.0]
    assert layers[2] == Layer("encoder", 1, 0.5, "block")


def test_the_attention_site_has_each_block_and_no_embed():
    layers = stack_layers({"decoder": 2}, "attention")
    assert [layer.name for layer in layers] == ["decoder.0.attn", "decoder.1.attn"]
    assert all(layer.is_block and layer.site == "attention" for layer in layers)


def test_an_unknown_site_is_refused():
    with pytest.raises(ValueError, match="probe site must be one of"):
        stack_layers({"encoder": 1}, "mlp")


@pytest.mark.parametrize("site", ["block", "attention"])
def test_a_name_parses_back_to_its_stack_index_and_site(site):
    for layer in stack_layers({"encoder": 2, "decoder": 12}, site):
        parsed = parse_layer(layer.name)
        expected = None if not layer.is_block else (layer.stack, layer.index, site)
        assert parsed == expected, layer.name
        assert is_block(layer.name) == (layer.is_block and site == "block")


@pytest.mark.parametrize("name", ["embed", "last", "mean", "decoder.0.cross", "encoder", "x.y"])
def test_names_of_no_block_parse_to_nothing(name):
    assert parse_layer(name) is None
    assert not is_block(name)
