"""The exchange gateway simulator: publishes trading days to the trades topic."""
