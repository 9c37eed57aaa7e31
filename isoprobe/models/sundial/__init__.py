"""Sundial (THUML 2025, ``thuml/sundial-base-128m``) on isoprobe's own network."""
