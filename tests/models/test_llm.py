"""The text LLM (GPT-2 / T5 on LLMTime serialisation) against independent paths: the serialised
text written by hand, transformers' own loss and generate, checkpoints saved with the official
classes."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.llm.module import LlmModule, positions
from isoprobe.models.llm.serialization import CharVocabulary, Serializer, TokenMap

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/llm.yaml")
CONTEXT, HORIZON = 8, 3
SIZES = {
    "gpt2": {"mini": {"n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 128}},
    "t5": {
        "mini": {
            "d_model": 16,
            "d_kv": 8,
            "d_ff": 32,
            "num_heads": 2,
            "num_layers": 2,
            "num_decoder_layers": 2,
        }
    },
}


def make_module(arch: str = "gpt2", checkpoint: str = "scratch", **kwargs) -> LlmModule:
    torch.manual_seed(0)
    module = LlmModule(
        arch=arch,
        checkpoint=checkpoint,
        sizes=SIZES,
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=kwargs.pop("context_length", CONTEXT),
        prediction_length=HORIZON,
        num_samples=kwargs.pop("num_samples", 4),
        **kwargs,
    )
    return module.eval()


def make_batch() -> dict[str, torch.Tensor]:
    """Scale q (the 0.95 quantile of |x|) of each row chosen so the digits are known."""
    nan = math.nan
    context = torch.tensor(
        [
            [nan, nan, nan, 1.0, 2.0, -0.5, 1.5, 2.0],  # padding, a negative value
            [4.0, 4.0, 4.0, 4.0, 4.0, nan, 4.0, 4.0],  # a missing value inside
        ]
    )
    target = torch.tensor([[1.0, -2.0, 0.25], [8.0, nan, 4.0]])
    return {"context": context, "target": target, "loc": torch.zeros(2), "scale": torch.ones(2)}


def hand_written(values: list[float], q: float) -> str:
    """LLMTime text of scaled values at precision 3, written independently of the serializer."""
    words = []
    for value in values:
        if math.isnan(value):
            words.append("NaN ,")
            continue
        digits = str(round(abs(value / q) * 1000))
        sign = "- " if value < 0 and digits != "0" else ""
        words.append(sign + " ".join(digits) + " ,")
    return " ".join(words)


def q95(row: torch.Tensor) -> float:
    return float(torch.nanquantile(row.double().abs(), 0.95))


# ----- serialisation ------------------------------------------------------------------------


def test_serialisation_writes_llmtime_text_and_reads_it_back_exactly():
    serializer = Serializer(precision=3, max_digits=5)
    scaled = [0.5, -1.25, 0.01, 0.0, -0.0004, 12.345, math.nan, 99.999]
    symbols = serializer.symbols(scaled)
    assert " ".join(symbols) == ("5 0 0 , - 1 2 5 0 , 1 0 , 0 , 0 , 1 2 3 4 5 , NaN , 9 9 9 9 9 ,")
    values, unreadable = serializer.parse(symbols, len(scaled))
    expected = [0.5, -1.25, 0.01, 0.0, 0.0, 12.345, math.nan, 99.999]
    assert unreadable == 1  # the missing value reads back as NaN
    for got, want in zip(values, expected, strict=True):
        assert (math.isnan(got) and math.isnan(want)) or got == want
    # larger magnitudes are clipped to max_digits digits; left padding is not written at all
    assert serializer.symbols([math.nan, math.nan, 123.4567]) == [*"99999", ","]


def test_unreadable_values_are_counted_and_missing_steps_are_nan():
    serializer = Serializer()
    values, unreadable = serializer.parse(["-", ",", "1", ",", ",", "2"], steps=4)
    assert values[1] == 0.001
    assert all(math.isnan(v) for v in (values[0], values[2], values[3]))
    assert unreadable == 3  # "-" alone, an empty value, "2" cut off before its separator


def test_context_tokens_and_real_token_counts_are_exact():
    module, batch = make_module(), make_batch()
    encoded, q = module.encode_context(batch)
    vocabulary = CharVocabulary()
    for row in range(2):
        values = batch["context"][row]
        observed = values[~values.isnan()] if row == 0 else values
        text = hand_written(observed.tolist(), q95(batch["context"][row]))
        ids = vocabulary.encode(text)
        assert encoded.ids[row, -len(ids) :].tolist() == ids
        assert encoded.attention[row].sum() == len(ids)
    # row 0: 1, 2, -0.5, 1.5, 2 over q = 2:
    # "5 0 0 ,", "1 0 0 0 ,", "- 2 5 0 ,", "7 5 0 ,", "1 0 0 0 ,"
    assert encoded.real[0].sum() == 4 + 5 + 5 + 4 + 5
    # row 1: seven values "1 0 0 0 ," are real; "NaN ," is not
    assert encoded.real[1].sum() == 7 * 5 and encoded.attention[1].sum() == 7 * 5 + 2
    assert not encoded.real[encoded.attention == 0].any()
    masks = module.token_masks(batch, ["embed", "decoder.1", "decoder.0.attn"])
    # the probe's real tokens write a value: the digits and signs, not the "," after them
    assert masks["embed"].sum(dim=1).tolist() == [3 + 4 + 4 + 3 + 4, 7 * 4]
    comma = module.token_map.symbol_ids[","][0]
    assert torch.equal(masks["embed"], encoded.real & encoded.ids.ne(comma))
    assert all(torch.equal(m, masks["embed"]) for m in masks.values())
    with pytest.raises(KeyError, match="unknown LLM layer"):
        module.token_masks(batch, ["lm_head"])


def test_t5_masks_leave_out_eos_and_the_decoder_start():
    module, batch = make_module("t5"), make_batch()
    masks = module.token_masks(batch, ["embed", "encoder.0", "decoder.1"])
    encoder, _ = module.encode_context(batch)
    assert encoder.ids[:, -1].eq(module.token_map.eos_id).all()
    assert not masks["encoder.0"][:, -1].any()
    assert encoder.real.sum() == 23 + 35
    assert masks["encoder.0"].sum() == 18 + 28  # the real tokens less their "," separators
    decoder = masks["decoder.1"]
    assert not decoder[:, 0].any()
    # targets over q: row 0 "5 0 0 , - 1 0 0 0 , 1 2 5 ," (14 tokens, the last is no input,
    # 2 of the other 13 are separators); row 1 "2 0 0 0 , NaN , 1 0 0 0 ," (10 real, 2 of them
    # separators, 2 padding after it)
    assert decoder[0].sum() == 14 - 1 - 2 and decoder[1].sum() == 10 - 2


def test_a_long_context_is_cut_at_a_value_boundary_to_fit_gpt2_positions():
    module = make_module(context_length=64)  # 128 positions, 3 x 7 kept for the horizon
    context = torch.full((1, 64), 0.5)
    encoded, _ = module.encode_context({"context": context})
    budget = 128 - HORIZON * 7
    assert encoded.ids.shape[1] == budget // 5 * 5  # whole "1 0 0 0 ," values only (x = q)
    assert encoded.ids[0, -1] == module.token_map.symbol_ids[","][0]


# ----- objective ----------------------------------------------------------------------------


def test_gpt2_loss_equals_transformers_loss_on_hand_written_ids():
    module, batch = make_module(), make_batch()
    vocabulary = CharVocabulary()
    losses, counts = [], []
    for row in range(2):
        q = q95(batch["context"][row])
        context = batch["context"][row]
        context = context[~context.isnan()] if row == 0 else context
        prompt = vocabulary.encode(hand_written(context.tolist(), q))
        target = vocabulary.encode(hand_written(batch["target"][row].tolist(), q))
        labels = list(target)
        if row == 1:  # the missing value: "NaN" and its separator are not predicted
            labels[5:7] = [-100, -100]
        ids = torch.tensor([prompt + target])
        labels = torch.tensor([[-100] * len(prompt) + labels])
        losses.append(module.lm(input_ids=ids, labels=labels).loss)
        counts.append(int((labels[:, 1:] != -100).sum()))
    expected = sum(loss * n for loss, n in zip(losses, counts, strict=True)) / sum(counts)
    torch.testing.assert_close(module.loss(batch), expected)


def test_t5_loss_equals_transformers_loss_on_hand_written_ids():
    module, batch = make_module("t5"), make_batch()
    vocabulary = CharVocabulary()
    eos = vocabulary.ids["<eos>"]
    encoder, labels = [], []
    for row in range(2):
        q = q95(batch["context"][row])
        context = batch["context"][row]
        context = context[~context.isnan()] if row == 0 else context
        encoder.append(vocabulary.encode(hand_written(context.tolist(), q)) + [eos])
        labels.append(vocabulary.encode(hand_written(batch["target"][row].tolist(), q)))
    labels[1][5:7] = [-100, -100]
    labels[1] += [-100] * (len(labels[0]) - len(labels[1]))
    width = max(len(row) for row in encoder)
    ids = torch.tensor([[0] * (width - len(row)) + row for row in encoder])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in encoder])
    expected = module.lm(input_ids=ids, attention_mask=mask, labels=torch.tensor(labels)).loss
    torch.testing.assert_close(module.loss(batch), expected)


# ----- forecasts ----------------------------------------------------------------------------


def read_text(text: str, steps: int, q: float) -> list[float]:
    """An independent reader: the first ``steps`` comma-separated numbers of generated text."""
    words = text.replace(" ", "").split(",")[:steps]
    return [int(w) / 1000 * q for w in words]


@pytest.mark.parametrize("arch", ["gpt2", "t5"])
def test_forecast_samples_equal_a_direct_seeded_generate(arch):
    module, batch = make_module(arch, num_samples=5), make_batch()
    torch.manual_seed(7)
    forecast = module.forecast(batch)
    kwargs, q = module.generation_inputs(batch)
    torch.manual_seed(7)
    generated = module.lm.generate(**kwargs)
    start = 1 if arch == "t5" else kwargs["input_ids"].shape[1]
    vocabulary = CharVocabulary()
    expected = torch.tensor(
        [
            read_text(vocabulary.decode(row[start:].tolist()), HORIZON, float(q[i // 5]))
            for i, row in enumerate(generated)
        ]
    ).view(2, 5, HORIZON)
    torch.testing.assert_close(forecast.samples, expected, rtol=1e-6, atol=0.0)
    assert module.unreadable_values == 0  # the grammar makes every sample readable
    levels = torch.tensor(module.quantile_levels)
    torch.testing.assert_close(
        forecast.quantiles, torch.quantile(expected, levels, dim=1).permute(1, 0, 2)
    )


def test_greedy_forecast_is_transformers_greedy_decoding_of_the_prompt():
    module, batch = make_module(num_samples=1, top_k=1), make_batch()
    forecast = module.forecast(batch)
    kwargs, q = module.generation_inputs(batch)
    prompt = kwargs["input_ids"]
    greedy = module.lm.generate(
        input_ids=prompt,
        attention_mask=kwargs["attention_mask"],
        do_sample=False,
        max_new_tokens=HORIZON * 7,
        logits_processor=kwargs["logits_processor"],
        pad_token_id=module.token_map.pad_id,
    )
    vocabulary = CharVocabulary()
    for row in range(2):
        text = vocabulary.decode(greedy[row, prompt.shape[1] :].tolist())
        expected = torch.tensor(read_text(text, HORIZON, float(q[row])))
        torch.testing.assert_close(forecast.median[row], expected, rtol=1e-6, atol=0.0)


def test_samples_that_cannot_be_read_are_counted_and_the_median_falls_back():
    module = make_module(num_samples=2)
    token_map = module.token_map
    one, comma, pad = token_map.symbol_ids["1"][0], token_map.symbol_ids[","][0], token_map.pad_id
    generated = torch.tensor([[one, comma, pad, pad], [comma, comma, comma, pad]])
    samples = module.read_samples(generated, 0, torch.tensor([2.0], dtype=torch.float64))
    assert samples[0, 0, 0] == 0.002 and samples.isnan().sum() == 5
    assert module.unreadable_values == 5


# ----- checkpoints --------------------------------------------------------------------------


def save_official(directory: Path, n_positions: int = 128) -> GPT2LMHeadModel:
    """A tiny GPT-2 saved by transformers itself, with isoprobe's vocabulary file."""
    vocabulary = CharVocabulary()
    config = GPT2Config(
        vocab_size=len(vocabulary),
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_positions=n_positions,
        bos_token_id=None,
        eos_token_id=vocabulary.ids["<eos>"],
        pad_token_id=vocabulary.ids["<pad>"],
    )
    torch.manual_seed(3)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    (directory / CharVocabulary.FILE).write_text(json.dumps({"tokens": vocabulary.tokens}))
    return model


def test_an_official_gpt2_directory_loads_and_forecasts_as_the_model(tmp_path):
    official = save_official(tmp_path / "gpt2")
    module, batch = make_module(checkpoint=str(tmp_path / "gpt2")), make_batch()
    assert module.resolved_checkpoint.kind == "path"
    for name, tensor in official.state_dict().items():
        assert torch.equal(module.lm.state_dict()[name], tensor), name
    kwargs, _ = module.generation_inputs(batch)
    torch.manual_seed(5)
    expected = official.generate(**kwargs)
    torch.manual_seed(5)
    assert torch.equal(module.lm.generate(**kwargs), expected)


def test_a_gpt2_checkpoint_with_a_bpe_tokenizer_uses_one_token_per_spaced_digit(tmp_path):
    """The hub path: a GPT-2 style byte-level BPE (``Ġ`` = space) read through AutoTokenizer."""
    directory = tmp_path / "bpe"
    directory.mkdir()
    symbols = [*"0123456789", ",", "-"]
    vocab = {"<|endoftext|>": 0, "Ġ": 1, "N": 2, "a": 3}
    vocab.update({s: len(vocab) + i for i, s in enumerate(symbols)})
    vocab.update({"Ġ" + s: len(vocab) + i for i, s in enumerate(symbols)})
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", s) for s in symbols]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    eos = "<|endoftext|>"
    tokenizer = GPT2TokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=eos, unk_token=eos)
    tokenizer.save_pretrained(directory)
    config = GPT2Config(
        vocab_size=len(vocab), n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(directory)
    module = make_module(checkpoint=str(directory))
    assert isinstance(module.token_map, TokenMap) and module.token_map.pad_id == 0
    encoded, _ = module.encode_context(make_batch())
    text = " " + hand_written([1.0, 2.0, -0.5, 1.5, 2.0], 2.0)
    ids = tokenizer(text)["input_ids"]
    assert encoded.ids[0, -len(ids) :].tolist() == ids  # LLMTime's rule: BPE == symbol ids
    forecast = make_module(checkpoint=str(directory)).forecast(make_batch())
    assert torch.isfinite(forecast.median).all()


def test_a_checkpoint_whose_tensor_does_not_fit_names_it(tmp_path):
    save_official(tmp_path / "gpt2")
    config = json.loads((tmp_path / "gpt2/config.json").read_text())
    (tmp_path / "gpt2/config.json").write_text(json.dumps({**config, "n_positions": 64}))
    with pytest.raises(CheckpointError, match=r"transformer\.wpe\.weight .*\(128, 16\)"):
        make_module(checkpoint=str(tmp_path / "gpt2"))


def test_a_checkpoint_of_the_other_architecture_is_refused(tmp_path):
    save_official(tmp_path / "gpt2")
    with pytest.raises(CheckpointError, match="holds a 'gpt2' model but model.arch=t5"):
        make_module("t5", checkpoint=str(tmp_path / "gpt2"))


def test_export_records_the_serialisation_and_reloads_it(tmp_path):
    module = make_module(precision=2, max_digits=4)
    module.export(str(tmp_path / "export"))
    reloaded = make_module(checkpoint=str(tmp_path / "export"))  # defaults would say 3 and 5
    assert reloaded.serializer == Serializer(precision=2, max_digits=4, alpha=0.95)
    assert (tmp_path / "export" / CharVocabulary.FILE).is_file()


def test_the_bundled_checkpoint_loads_with_the_configured_mini_shape():
    module = LlmModule(
        checkpoint="bundled",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=HORIZON,
    )
    mini = CONFIG.sizes.gpt2.mini
    assert module.lm.config.n_embd == mini.n_embd and module.lm.config.n_layer == mini.n_layer
    assert all(m.training for m in module.modules())  # fine-tuning runs with dropout


def test_attention_weights_split_gpt2_fused_projection():
    module = make_module()
    attention = module.lm.transformer.h[1].attn
    x = torch.randn(5, 16)
    qkv = attention.c_attn(x)
    parts = module.attention_weights()["decoder.1"]
    bias = attention.c_attn.bias.split(16)
    for i, name in enumerate("qkv"):
        torch.testing.assert_close(x @ parts[name].T + bias[i], qkv[:, 16 * i : 16 * (i + 1)])
    torch.testing.assert_close(x @ parts["o"].T + attention.c_proj.bias, attention.c_proj(x))


def test_memory_estimates_grow_with_batch_and_samples():
    module = make_module()
    weights = 16 * sum(p.numel() for p in module.parameters())
    assert module.training_memory_bytes(0) == weights
    step = module.training_memory_bytes(2) - weights
    assert step > 0 and module.training_memory_bytes(4) - weights == 2 * step
    few = module.forecast_memory_bytes(2)
    module.num_samples = 40
    assert module.forecast_memory_bytes(2) > few


def test_the_loss_reads_left_padded_prompts_at_the_positions_generate_uses():
    module, batch = make_module(), make_batch()
    kwargs, _ = module.generation_inputs(batch)
    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
    assert (mask == 0).any()  # row 0 is left padded
    out = module.lm.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=1,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=module.token_map.pad_id,
    )
    encoded, _ = module.encode_context(batch)
    logits = module.lm(
        input_ids=encoded.ids, attention_mask=encoded.attention, position_ids=positions(mask)
    ).logits
    torch.testing.assert_close(logits[:, -1], out.logits[0])
