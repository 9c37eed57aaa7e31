"""Forecaster wrappers: one module per model family on a shared :class:`ForecastModule`
(:mod:`isoprobe.models.base`); a family that spans several files is a subpackage."""
