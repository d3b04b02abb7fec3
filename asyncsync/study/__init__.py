"""From a recipe to runs: the recipe and its specs, the runner and its executors, the nodes
of a real run, the virtual-time simulation, the assembly of a server and its workers, and
the live dashboard."""
