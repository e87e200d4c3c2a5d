"""Pipelines as Dagster asset graphs: one YAML file -> assets under a key prefix, a job, a resource."""
