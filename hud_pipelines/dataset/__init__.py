"""Every eval's rollouts as a LeRobot v3 dataset, written through lerobot's own ``LeRobotDataset``.

- :mod:`.options`: what a pipeline can choose (camera storage, codec, state features, writers).
- :mod:`.features`: contract -> LeRobot features, and one recorded frame -> one LeRobot frame.
- :mod:`.writer`: :class:`~.writer.LeRobotDatasetSink`, an ``EpisodeSink`` writing one shard.
- :mod:`.part` / :mod:`.process`: one part of a shard, written by lerobot here or in a child process.
- :mod:`.lerobot_hooks`: where a part steps into lerobot's ``save_episode`` (camera frames encoded
  from memory by :mod:`.episode_video`, stats by :mod:`.image_stats`, one embedding call per
  episode), each writing what lerobot's default path writes.
- :mod:`.merge`: shards -> one dataset (lerobot's aggregation).
- :mod:`.publish`: :class:`~.publish.DatasetBuild`, shards beside the published path, swapped in atomically.
- :mod:`.cancel`: SIGTERM as an interrupt, so writers finalize when a run is terminated.
- :mod:`.summary`: what a Dagster asset shows about the published dataset.

Importing this package is cheap; lerobot (about 11 s to import) is loaded by the modules that write.
"""
