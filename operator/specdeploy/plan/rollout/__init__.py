"""Which revisions serve and how a new pair earns its place: revision replicas, canary analysis,
the collapse guard, speculation on or off, the autotuner, and when a verdict falls due."""
