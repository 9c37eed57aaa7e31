"""Lag-Llama (Rasul et al., 2023): the LightningModule (:mod:`.module`), its network
(:mod:`.network`) and the official checkpoint read safely (:mod:`.checkpoint`)."""
