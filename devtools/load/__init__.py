"""Traffic and attacks: slice pods at a steady rate, hostile clients, a fleet of nodes, a slow link."""
