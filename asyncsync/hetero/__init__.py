"""Heterogeneity: compute slowdowns, link shaping and data partitions."""
