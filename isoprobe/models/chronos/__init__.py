"""The Chronos family (Ansari et al., 2024, 2025; chronos-forecasting): Chronos-T5 (:mod:`.t5`),
Chronos-Bolt (:mod:`.bolt`) and Chronos-2 (:mod:`.chronos2`), with the modules only they use."""
