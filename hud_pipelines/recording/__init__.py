"""Recording: what a rollout hands to its recorders (episode keys, frames, outcomes), one trace per slot
per episode (JSON lines of typed steps), per-camera video, and ``wrap(env)`` for a loop the user owns.

Submodules are imported directly; this package's root stays empty so the sim child and light tools
can import one of them without the rest.
"""
