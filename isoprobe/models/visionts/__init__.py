"""VisionTS (Chen et al., 2024): the LightningModule (:mod:`.module`), the series as an image
(:mod:`.image`), the masked autoencoder (:mod:`.mae`) and its weights (:mod:`.checkpoint`)."""
