"""PatchTST's inference batch norm against transformers' own module: the same outputs in
evaluation, the official forward (same bits, same running statistics) in training."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import PatchTSTConfig, PatchTSTForPrediction
from transformers.models.patchtst.modeling_patchtst import PatchTSTBatchNorm

from isoprobe.models.patchtst_inference import RunningStatisticsBatchNorm, use_inference_kernels

CONFIG = PatchTSTConfig(
    num_input_channels=1,
    context_length=96,
    prediction_length=12,
    patch_length=16,
    patch_stride=8,
    d_model=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    ffn_dim=64,
)


def swapped_pair(module: torch.nn.Module, cls: type) -> tuple[torch.nn.Module, torch.nn.Module]:
    own = copy.deepcopy(module)
    own.__class__ = cls
    return module, own


def trained_batch_norm() -> PatchTSTBatchNorm:
    """A batch norm whose running statistics and affine weights are far from their defaults."""
    torch.manual_seed(0)
    norm = PatchTSTBatchNorm(CONFIG)
    norm.batchnorm.running_mean.normal_(3.0, 2.0)
    norm.batchnorm.running_var.uniform_(0.1, 9.0)
    norm.batchnorm.weight.data.normal_(1.0, 0.5)
    norm.batchnorm.bias.data.normal_(0.0, 0.5)
    return norm


def test_running_statistics_batch_norm_equals_the_official_in_evaluation():
    official, own = swapped_pair(trained_batch_norm().eval(), RunningStatisticsBatchNorm)
    inputs = torch.randn(6, 13, 32) * 4 + 1
    torch.testing.assert_close(own(inputs), official(inputs), rtol=1e-6, atol=1e-6)
    assert own(inputs).is_contiguous()  # no transposed view handed to the next projection


def test_running_statistics_batch_norm_trains_as_the_official():
    official, own = swapped_pair(trained_batch_norm().train(), RunningStatisticsBatchNorm)
    inputs = torch.randn(6, 13, 32) * 4 + 1
    assert torch.equal(own(inputs), official(inputs))
    assert torch.equal(own.batchnorm.running_mean, official.batchnorm.running_mean)
    assert torch.equal(own.batchnorm.running_var, official.batchnorm.running_var)


@pytest.mark.parametrize("norm_type", ["batchnorm", "layernorm"])
def test_a_swapped_model_forecasts_as_the_official_and_keeps_its_parameters(norm_type):
    torch.manual_seed(0)
    official = PatchTSTForPrediction(PatchTSTConfig(**{**CONFIG.to_dict(), "norm_type": norm_type}))
    if norm_type == "batchnorm":
        for module in official.modules():
            if isinstance(module, PatchTSTBatchNorm):
                module.batchnorm.running_mean.normal_(0.0, 0.3)
                module.batchnorm.running_var.uniform_(0.5, 2.0)
    official.eval()
    own = copy.deepcopy(official)
    use_inference_kernels(own)
    swapped = {type(m) for m in own.modules()}
    assert (RunningStatisticsBatchNorm in swapped) == (norm_type == "batchnorm")
    assert PatchTSTBatchNorm not in swapped
    assert own.state_dict().keys() == official.state_dict().keys()
    values = torch.randn(5, 96, 1).cumsum(1)
    with torch.no_grad():
        expected = official(past_values=values).prediction_outputs
        output = own(past_values=values).prediction_outputs
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
