"""What users write and read: nodes (``node``), joins, the context tasks see,
results and reports, and the compiled ``Plan`` a run executes.

The names are exported from ``taskflow``; this part imports only the resilience options and the
leaves (errors, logs).
"""
