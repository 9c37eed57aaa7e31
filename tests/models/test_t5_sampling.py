"""isoprobe's T5 sampling against transformers: the decoder step, the draw and whole forecasts."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from isoprobe.models.chronos.t5_sampling import DecoderCache, decode_step, draw, sample_tokens
from tests.models.test_chronos_t5 import make_batch, make_module

WINDOWS, TOKENS, SAMPLES, STEPS = 3, 11, 4, 9


def tiny_t5(**changes) -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    shape = {
        "vocab_size": 300,
        "d_model": 32,
        "d_kv": 8,
        "num_heads": 4,
        "d_ff": 64,
        "num_layers": 2,
        "num_decoder_layers": 3,
        "feed_forward_proj": "relu",
    }
    config = T5Config(
        **{**shape, **changes}, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0
    )
    return T5ForConditionalGeneration(config).eval()


def encoded(t5: T5ForConditionalGeneration) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, t5.config.vocab_size, (WINDOWS, TOKENS))
    mask = torch.ones(WINDOWS, TOKENS, dtype=torch.long)
    mask[0, :3] = 0  # a left-padded window
    return ids, mask, t5.encoder(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize(
    "changes",
    [{}, {"tie_word_embeddings": False, "feed_forward_proj": "gated-gelu"}],
    ids=["tied-relu", "untied-gated-gelu"],
)
@torch.no_grad()
def test_decode_step_gives_t5s_own_logits_at_every_position(changes):
    t5 = tiny_t5(**changes)
    ids, mask, states = encoded(t5)
    sequences = WINDOWS * SAMPLES
    inputs = torch.randint(2, t5.config.vocab_size, (sequences, STEPS))
    inputs[:, 0] = 0
    expected = t5(
        input_ids=ids.repeat_interleave(SAMPLES, 0),
        attention_mask=mask.repeat_interleave(SAMPLES, 0),
        decoder_input_ids=inputs,
    ).logits
    cache = DecoderCache(t5, states, mask, STEPS, SAMPLES)
    logits = torch.stack([decode_step(t5, inputs[:, t], t, cache) for t in range(STEPS)], 1)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_keeping_one_token_decodes_as_generates_greedy_search():
    t5 = tiny_t5(num_decoder_layers=2)  # generate's cache needs as many layers as the encoder
    ids, mask, states = encoded(t5)
    tokens = sample_tokens(
        t5, states, mask, steps=STEPS, num_samples=2, start_token=0, banned_token=1, top_k=1
    )
    greedy = t5.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, min_new_tokens=STEPS,
        max_new_tokens=STEPS, eos_token_id=1, pad_token_id=0, decoder_start_token_id=0,
    )[:, 1:]  # fmt: skip
    assert torch.equal(tokens, greedy[:, None].expand(-1, 2, -1))


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 3, 1.0), (0.7, 4, 0.8), (1.3, 0, 0.9)]
)
def test_draws_follow_transformers_filtered_distribution(temperature, top_k, top_p):
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.7, -3.0, 0.9]])
    expected = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k > 0:
        expected = TopKLogitsWarper(top_k)(None, expected)
    expected = TopPLogitsWarper(top_p)(None, expected).softmax(-1)[0]
    torch.manual_seed(0)
    drawn = draw(logits.expand(200_000, -1), temperature, top_k, top_p)
    frequency = torch.bincount(drawn, minlength=logits.shape[1]) / len(drawn)
    assert torch.equal(frequency > 0, expected > 0)  # the same tokens are ever drawn
    torch.testing.assert_close(frequency, expected, rtol=0, atol=0.005)


@pytest.mark.parametrize("input_embedding", ["learned", "chebyshev"])
def test_fast_and_generate_samplers_forecast_alike_when_one_token_is_kept(input_embedding):
    fast = make_module(input_embedding=input_embedding, top_k=1)
    generate = make_module(input_embedding=input_embedding, top_k=1, sampler="generate")
    batch = make_batch()
    torch.testing.assert_close(fast.forecast(batch).samples, generate.forecast(batch).samples)


def test_an_unknown_sampler_names_the_choices():
    with pytest.raises(ValueError, match=r"model.sampler must be one of \('fast', 'generate'\)"):
        make_module(sampler="beam")


@pytest.mark.parametrize("setting", [{"temperature": 0.0}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_sampling_settings_that_define_no_distribution_are_refused(setting):
    with pytest.raises(ValueError, match=r"model.temperature must be > 0 and model.top_p in"):
        make_module(**setting)
