"""Scaling studies: the TOML spec of a study's runs and the collection of their results into one table."""
