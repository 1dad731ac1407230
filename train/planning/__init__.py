"""The plan: what a run will need, checked against what the devices and host have."""
