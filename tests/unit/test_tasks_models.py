"""Model construction: shapes, parameter counts, activations and argument checks."""

import pytest
import torch
from torch import nn

from fedbayes.tasks.config import ModelSettings
from fedbayes.tasks.models import build_model, build_run_model, parse_hidden
from tests.support import settings


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
    with pytest.raises(ValueError, match="logreg, mlp, cnn-zenke, cnn-acar, resnet20, resnet20-gn"):
        build_model("resnet", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="sigmoid, relu, tanh"):
        build_model("mlp", (1, 28, 28), 10, activation="gelu")


def test_a_run_builds_the_model_its_model_keys_name():
    architecture = settings(model="mlp", hidden="64,32", activation="tanh", pool=2).architecture
    assert architecture == ModelSettings(model="mlp", hidden="64,32", activation="tanh", pool=2)
    model = build_run_model(architecture, (1, 28, 28), 10)
    kinds = [type(layer) for layer in model]
    assert kinds == [nn.AvgPool2d, nn.Flatten, nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]
    assert model[2].in_features == 14 * 14 and model[6].out_features == 10


def test_a_run_model_built_to_hold_tensors_refuses_others():
    architecture = settings(model="mlp", hidden="16").architecture
    held = {
        name: tuple(value.shape) for name, value in build_run_model(architecture, (1, 28, 28), 10).state_dict().items()
    }
    assert list(build_run_model(architecture, (1, 28, 28), 10, held).state_dict()) == list(held)
    with pytest.raises(ValueError, match="not those held"):
        build_run_model(settings(model="mlp", hidden="17").architecture, (1, 28, 28), 10, held)


def test_parse_hidden():
    assert parse_hidden("200,100") == (200, 100)
    assert parse_hidden(" 64 , 32 ") == (64, 32)
    assert parse_hidden("") == ()
    for bad in ("200,,100", "wide", "200,0", "-5"):
        with pytest.raises(ValueError, match="hidden"):
            parse_hidden(bad)


CIFAR10, FMNIST = ((3, 32, 32), 10), ((1, 28, 28), 10)


@pytest.mark.parametrize(
    "name,parameters", [("cnn-zenke", 1250858), ("cnn-acar", 797962), ("resnet20", 270410), ("resnet20-gn", 269722)]
)
def test_the_papers_conv_models_have_their_parameter_counts_and_no_buffers(name, parameters):
    model = build_model(name, *CIFAR10)
    assert count_parameters(model) == parameters  # Zenke 2304-512 head; Acar 1600-384-192; ResNet-20 ~0.27M
    assert list(model.buffers()) == []  # the whole state is the parameters, so it can all go on the wire
    assert list(model.state_dict()) == [n for n, _ in model.named_parameters()]


@pytest.mark.parametrize("name", ["cnn-zenke", "cnn-acar", "resnet20", "resnet20-gn"])
@pytest.mark.parametrize("input_shape,num_classes", [FMNIST, CIFAR10, ((3, 32, 32), 100)])
def test_conv_models_take_fmnist_and_cifar_shapes(name, input_shape, num_classes):
    model = build_model(name, input_shape, num_classes).eval()
    assert model(torch.zeros(2, *input_shape)).shape == (2, num_classes)


def test_fmnist_sizes_the_first_linear_layer_without_padding():
    assert build_model("cnn-zenke", *FMNIST)[13].in_features == 64 * 5 * 5
    assert build_model("cnn-acar", *FMNIST)[7].in_features == 64 * 4 * 4


def test_resnet20_names_its_tensors_by_module_and_uses_frn_or_groupnorm():
    frn, gn = build_model("resnet20", *CIFAR10), build_model("resnet20-gn", *CIFAR10)
    assert "layer3.2.bn2.tau" in frn.state_dict() and "linear.weight" in frn.state_dict()
    assert isinstance(gn.layer2[0].bn1, nn.GroupNorm) and gn.layer2[0].bn1.num_groups == 2


def test_dropout_follows_the_mode():
    torch.manual_seed(0)
    model, images = build_model("cnn-zenke", *CIFAR10), torch.rand(4, 3, 32, 32)
    assert not torch.equal(model.train()(images), model(images))  # two dropout masks
    assert torch.equal(model.eval()(images), model(images))


def test_conv_models_refuse_pool_and_too_small_inputs():
    with pytest.raises(ValueError, match="pool"):
        build_model("cnn-acar", *FMNIST, pool=4)
    with pytest.raises(ValueError, match="too small"):
        build_model("cnn-acar", (1, 8, 8), 10)
