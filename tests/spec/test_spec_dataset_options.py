"""The `dataset:` section reaches the dataset writer unchanged."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hud_pipelines.spec.dataset_options import CameraStorage, VideoCodec
from hud_pipelines.spec.sections import DatasetSpec


def test_the_dataset_section_becomes_the_writer_options() -> None:
    options = DatasetSpec.model_validate(
        {
            "video": False,
            "codec": "libsvtav1",
            "state_features": ["agent_pos"],
            "keep_errored": True,
            "writers": 2,
        }
    ).writer_options()
    assert options.cameras is CameraStorage.IMAGE
    assert options.codec is VideoCodec.AV1
    assert options.state_features == ["agent_pos"]
    assert options.keep_errored
    assert options.writers == 2
    defaults = DatasetSpec().writer_options()
    assert (defaults.cameras, defaults.codec, defaults.writers) == (CameraStorage.VIDEO, VideoCodec.H264, 1)


def test_an_unknown_codec_is_refused() -> None:
    with pytest.raises(ValidationError, match="codec"):
        DatasetSpec.model_validate({"codec": "mpeg2"})
