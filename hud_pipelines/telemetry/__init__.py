"""Telemetry: one trace per slot per episode (JSON lines of typed steps), optional camera video."""
