"""The probe of hidden representations: one Lightning callback, :class:`ProbeCallback`."""

from isoprobe.probing.callback import ProbeCallback

__all__ = ["ProbeCallback"]
