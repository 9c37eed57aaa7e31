"""Forecaster wrappers: one module per model family on a shared :class:`ForecastModule`."""

from isoprobe.models.base import Forecast, ForecastModule
from isoprobe.models.chronos_t5 import ChronosT5Module

__all__ = ["ChronosT5Module", "Forecast", "ForecastModule"]
