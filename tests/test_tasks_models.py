"""Model construction: shapes, parameter counts, activations and argument checks."""

import pytest
import torch
from torch import nn

from tasks.models import build_model, parse_hidden


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["logreg", "mlp"])
@pytest.mark.parametrize("input_shape,num_classes", [((1, 28, 28), 10), ((3, 32, 32), 100)])
def test_output_is_one_logit_per_class(name, input_shape, num_classes):
    model = build_model(name, input_shape, num_classes)
    assert model(torch.zeros(4, *input_shape)).shape == (4, num_classes)


def test_parameter_counts_match_the_paper_models():
    assert count_parameters(build_model("mlp", (1, 28, 28), 10)) == 178110  # 784-200-100-10
    assert count_parameters(build_model("logreg", (1, 28, 28), 10)) == 7850


def test_state_dict_names_are_layer_positions():
    model = build_model("mlp", (1, 28, 28), 10)
    assert list(model.state_dict()) == ["1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias"]


def test_activation_choice_is_honoured():
    model = build_model("mlp", (1, 28, 28), 10, hidden=(32,), activation="relu")
    kinds = [type(layer) for layer in model]
    assert kinds == [nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]
    assert not any(isinstance(layer, nn.Sigmoid) for layer in model)


def test_mlp_without_hidden_layers_is_logistic_regression():
    model = build_model("mlp", (1, 28, 28), 10, hidden=())
    assert [type(layer) for layer in model] == [nn.Flatten, nn.Linear]


def test_bad_names_list_the_choices():
    with pytest.raises(ValueError, match="logreg, mlp"):
        build_model("resnet", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="sigmoid, relu, tanh"):
        build_model("mlp", (1, 28, 28), 10, activation="gelu")


def test_parse_hidden():
    assert parse_hidden("200,100") == (200, 100)
    assert parse_hidden(" 64 , 32 ") == (64, 32)
    assert parse_hidden("") == ()
    for bad in ("200,,100", "wide", "200,0", "-5"):
        with pytest.raises(ValueError, match="hidden"):
            parse_hidden(bad)
