"""Lightning callbacks that probe hidden representations (installed as ``isoprobe.probing``)."""

from isoprobe.probing.isotropy import IsotropyProbe
from isoprobe.probing.probe import Probe
from isoprobe.probing.rank import RankProbe

__all__ = ["IsotropyProbe", "Probe", "RankProbe"]
