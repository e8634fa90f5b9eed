"""relaybot's benchmarks; each runs its baseline side by side (see bench/README.md)."""
