"""The agent side: policies behind one batched seam, the lockstep agent loop, cross-sim batching."""
