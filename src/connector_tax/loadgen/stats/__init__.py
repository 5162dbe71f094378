"""The results side, in the main process: each result matched to its request, written as a record, folded into the cell's summary."""
