"""The embedded open-loop load generator: the study's measuring instrument."""
