"""The main process: a session, its cells in real time (schedule, rules, hand-over to the workers), and the server check and prompt sizing before them."""
