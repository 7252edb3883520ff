"""Scaling studies: a grid of config overrides x seeds, each cell trained and evaluated."""
