"""Server lifecycle: launch, readiness, stop — no orphan processes on any exit path."""
