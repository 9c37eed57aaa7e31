"""Lightning callbacks that probe hidden representations (installed as ``isoprobe.callbacks``)."""

from isoprobe.callbacks.isotropy import IsotropyProbe

__all__ = ["IsotropyProbe"]
