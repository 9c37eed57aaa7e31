"""The rank-structure paper's figure 2: the singular values of embedded inputs, for every
time-series model isoprobe has and for text and image baselines (``task=embedding_spectra``)."""
