"""What a pipeline chooses about its dataset; the defaults are the ones the benchmark measures."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from hud_pipelines.spec.base import Count, Float, StrictModel


class CameraStorage(StrEnum):
    """How camera frames are stored: one mp4 per camera and file (``video``) or PNGs in parquet (``image``)."""

    VIDEO = "video"
    IMAGE = "image"


class VideoCodec(StrEnum):
    """Codecs lerobot can write through PyAV.

    ``h264`` is the default: for small sim cameras it encodes about 10x faster than SVT-AV1 at a
    similar size (``bench/dataset.md``) and every decoder reads it. ``libsvtav1`` is lerobot's own
    default, smaller at high resolutions.
    """

    H264 = "h264"
    AV1 = "libsvtav1"


class DatasetOptions(StrictModel):
    """The dataset writer's settings: what a pipeline's ``dataset:`` section asks for
    (:meth:`~hud_pipelines.spec.sections.DatasetSpec.writer_options`), or what a caller of ``DatasetBuild`` or
    ``LeRobotDatasetSink`` passes."""

    cameras: CameraStorage = Field(default=CameraStorage.VIDEO, description="'video' (mp4) or 'image' (PNG)")
    codec: VideoCodec = Field(default=VideoCodec.H264, description="video codec when cameras are 'video'")
    state_features: list[str] | None = Field(
        default=None,
        description="observation features concatenated, in this order, into observation.state; by default every "
        "non-camera observation feature in contract order whose values float32 keeps "
        "(:func:`~hud_pipelines.dataset.features.exact_in_float32`). The other vectors become observation.<name>",
    )
    keep_errored: bool = Field(
        default=False,
        description="keep errored episodes, flagged by an 'episode.errored' column, instead of leaving them out",
    )
    writers: Count = Field(
        default=1,
        le=32,
        description="writer threads per shard, each writing its own part; the merge orders episodes by task, then seed",
    )
    queued_episodes: Count = Field(
        default=4, description="finished episodes that may wait for a writer before end() blocks (bounds memory)"
    )
    close_timeout_s: Float = Field(
        default=600.0, gt=0, description="how long close() waits for the writers to drain and finalize"
    )
