"""Metric sinks: metrics.jsonl (always), and the `logger` group's choice (console, ...)."""
