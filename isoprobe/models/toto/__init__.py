"""Toto (Datadog, 2025): the LightningModule (:mod:`.module`), isoprobe's own network
(:mod:`.network`), its architecture as data (:mod:`.config`) and its weights (:mod:`.loading`)."""
