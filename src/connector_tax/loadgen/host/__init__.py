"""Host placement: which CPUs each process and thread runs on, their scheduling class, and the CPU wake-up limit held during a run."""
