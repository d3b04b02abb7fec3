"""From a study's run folders to tables and plots: summaries, the comparison table, plots."""
