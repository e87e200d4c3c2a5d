"""Example sims, scripted experts and fault-injection envs used by the bundled pipelines and tests."""
