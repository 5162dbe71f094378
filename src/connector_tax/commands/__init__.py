"""One module per `ctax` command: its arguments as a frozen dataclass, the function that adds them
to its parser, and its `main`, which takes the dataclass and returns the exit code (README.md).
Nothing is imported here: the console script (connector_tax.cli) imports only the command typed."""
