"""The run around the steps: its state and snapshots (counters, data position, random streams),
progress lines, statistics, image grids and charts, the divergence stop, and metrics at snapshots."""
