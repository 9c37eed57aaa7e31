"""Moirai 1.x (Woo et al., 2024): the LightningModule (:mod:`.module`) and its loading from
uni2ts (:mod:`.loading`)."""
