"""GPU health: what a host has (facts), how fast it is (probe), and whether that is good enough (health)."""
