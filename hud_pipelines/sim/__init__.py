"""Serving sims: the bridge (slots in lockstep), the server, the process handle and the client."""
