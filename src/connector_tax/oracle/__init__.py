"""What a simulated study should find, computed rather than measured: the truth oracle, the
coverage check of the analysis's intervals, and study cells in the simulator's virtual time.
Above the simulated server (a leaf), the load generator and the analysis, whose code it reuses."""
