"""Failover drills, the Jepsen-style checker, the process harness and the demo."""
