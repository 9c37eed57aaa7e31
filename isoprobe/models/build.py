"""A ``ForecastModule`` from its ``configs/model/*.yaml`` config and the windows it reads: what
every task that runs a model builds, and what ``task=embedding_spectra`` builds for each model
it embeds with."""

from __future__ import annotations

from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from isoprobe.models.adaptation import adapt_model, check_adapt
from isoprobe.models.base import ForecastModule
from isoprobe.models.compression import low_rank_attention
from isoprobe.models.compression_files import apply_saved_compression


def build_model(model_cfg: DictConfig, datamodule: Any) -> ForecastModule:
    """The model config with the data module's window lengths, season and frequency; a
    checkpoint directory that ``task=compress`` or a low-rank pretraining wrote gets its factored
    projections back, and ``model.low_rank.enabled`` factors a model's attention by design;
    ``model.adapt`` then chooses what training changes (:mod:`isoprobe.models.adaptation`).

    ``datamodule`` is the run's data module, or anything with its ``context_length``,
    ``prediction_length``, ``season_length`` and ``freq``."""
    kwargs = OmegaConf.to_container(model_cfg, resolve=True)
    kwargs.pop("name", None)
    low_rank = kwargs.pop("low_rank", None) or {}
    adapt, lora = kwargs.pop("adapt", "full"), kwargs.pop("lora", None)
    kwargs.pop("allow_random_weights", None)  # a run's setting (check_adapt_needs_weights)
    check_adapt(adapt, lora)  # a wrong setting fails before the weights load
    try:
        model = instantiate(
            kwargs,
            context_length=datamodule.context_length,
            prediction_length=datamodule.prediction_length,
            season_length=datamodule.season_length,
            freq=datamodule.freq,
            _convert_="all",
        )
    except InstantiationException as err:
        # the model's own error (a checkpoint that does not fit, a missing extra) says what to
        # do; Hydra's wrapper would bury it in a repr
        if err.__cause__ is None:
            raise
        raise err.__cause__ from None
    saved = None
    if model.resolved_checkpoint.kind == "path":
        saved = apply_saved_compression(model, model.resolved_checkpoint.location)
    if saved is None and low_rank.get("enabled"):
        low_rank_attention(model, low_rank["r_first"], low_rank["r_last"], low_rank["alpha"])
    adapt_model(model, adapt, lora)
    return model
