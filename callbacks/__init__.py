"""Lightning callbacks that probe hidden representations (installed as ``isoprobe.callbacks``)."""

from isoprobe.callbacks.isotropy import IsotropyProbe
from isoprobe.callbacks.probe import Probe
from isoprobe.callbacks.rank import RankProbe

__all__ = ["IsotropyProbe", "Probe", "RankProbe"]
