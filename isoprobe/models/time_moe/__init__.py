"""Time-MoE (Shi et al., 2024): the LightningModule (:mod:`.module`), isoprobe's own network
(:mod:`.network`), its config.json as data (:mod:`.config`) and its weights (:mod:`.loading`)."""
