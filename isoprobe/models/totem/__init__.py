"""TOTEM (Talukder, Yue & Gkioxari, 2024): the VQ-VAE tokenizer (:mod:`.tokenizer`) and its
published whole-module pickles read without running code (:mod:`.checkpoint`)."""
