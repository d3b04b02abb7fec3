"""A run's log files, the interface between the engine that writes them and the results that
read them: the one schema (`schema`), the writers and time accounting (`metrics`), and the
readers (`reading`)."""
