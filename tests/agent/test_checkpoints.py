"""Checkpoint discovery on real lerobot-train folders: layouts, completeness, order, content hashes, errors.

The lerobot runs are written by lerobot's own ``save_checkpoint`` (``checkpoint_runs.py``); tests that
change a run work on a copy of the session's run.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from checkpoint_runs import (
    RUN_STEPS,
    LeRobotRun,
    age,
    copy_run,
    lerobot_run_fixture,  # noqa: F401  # pyright: ignore[reportUnusedImport]  (the fixture lerobot_run)
    tiny_act,
    write_lerobot_run,
    write_torch_checkpoints,
)

from hud_pipelines.agent.checkpoints import (
    Checkpoint,
    CheckpointError,
    Discovery,
    ExplicitCheckpoint,
    WatchedDirectory,
    discover_checkpoints,
)
from hud_pipelines.errors import HudPipelinesError

STEPS = RUN_STEPS


@pytest.fixture
def run(lerobot_run: LeRobotRun) -> LeRobotRun:
    return lerobot_run


@pytest.fixture
def run_copy(lerobot_run: LeRobotRun, tmp_path: Path) -> LeRobotRun:
    """The session's run copied, to change without touching the other tests' run."""
    return copy_run(lerobot_run, tmp_path)


def discover(*sources: WatchedDirectory | ExplicitCheckpoint, settle_s: float = 0.0) -> Discovery:
    return discover_checkpoints(sources, settle_s=settle_s)


def labels(checkpoints: tuple[Checkpoint, ...]) -> list[str]:
    return [c.label for c in checkpoints]


def reasons(discovery: Discovery) -> dict[str, str]:
    return {p.checkpoint.label: p.reason for p in discovery.pending}


# -- layouts ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("where", ["output_dir", "checkpoints_dir"])
def test_a_lerobot_train_run_lists_each_step_once_with_its_pretrained_model(run: LeRobotRun, where: str) -> None:
    assert (run.checkpoints_dir / "last").is_symlink(), "lerobot-train's own link to the newest step"
    found = discover(WatchedDirectory(getattr(run, where)))
    assert found.pending == ()
    assert found.complete == tuple(
        Checkpoint(label=run.step_dirs[step].name, path=run.pretrained(step), step=step) for step in STEPS
    )
    assert labels(found.complete) == [f"{step:06d}" for step in STEPS]


@pytest.mark.slow
def test_a_folder_of_save_pretrained_folders_gives_one_checkpoint_per_policy_folder(
    run: LeRobotRun, tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    for name, step in [("late", 1500), ("200", 500), ("early", 1000)]:
        shutil.copytree(run.pretrained(step), policies / name)
    (policies / "logs").mkdir()  # no policy files: not a checkpoint
    (policies / "notes.txt").write_text("not a folder")
    (policies / ".cache").mkdir()
    shutil.copytree(run.pretrained(500), policies / ".cache" / "hidden")

    found = discover(WatchedDirectory(policies))
    assert [(c.label, c.step, c.path) for c in found.complete] == [
        ("early", None, policies / "early"),
        ("late", None, policies / "late"),
        ("200", 200, policies / "200"),
    ]


@pytest.mark.slow
def test_checkpoints_naming_one_step_folder_is_that_checkpoint_named_by_its_step(run: LeRobotRun) -> None:
    """It was named after its policy folder, ``pretrained_model``, with no step."""
    found = discover(WatchedDirectory(run.step_dirs[500]))
    assert found.complete == (Checkpoint(label=run.step_dirs[500].name, path=run.pretrained(500), step=500),)


@pytest.mark.slow
def test_a_symlink_to_a_listed_checkpoint_is_not_a_second_one_but_a_link_elsewhere_is(
    run: LeRobotRun, tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(run.pretrained(500), policies / "early")
    shutil.copytree(run.pretrained(1000), tmp_path / "elsewhere" / "late")
    (policies / "best").symlink_to("early")
    (policies / "best_again").symlink_to(policies / "early")
    (policies / "late").symlink_to(tmp_path / "elsewhere" / "late")
    (policies / "gone").symlink_to(tmp_path / "missing")  # a dangling link is nothing

    found = discover(WatchedDirectory(policies))
    assert labels(found.complete) == ["early", "late"]
    assert found.complete[1].path == policies / "late"


@pytest.mark.slow
def test_several_runs_label_their_checkpoints_run_slash_step_in_run_order(tmp_path: Path) -> None:
    first = write_lerobot_run(tmp_path / "act_b", [20, 10])
    second = write_lerobot_run(tmp_path / "act_a", [30])

    found = discover(WatchedDirectory(first.output_dir), WatchedDirectory(second.checkpoints_dir))
    assert [(c.label, c.run, c.step) for c in found.complete] == [
        ("act_b/000010", "act_b", 10),
        ("act_b/000020", "act_b", 20),
        ("act_a/000030", "act_a", 30),
    ], "runs as they are listed (the last one listed holds the candidate), each in step order"
    assert found.complete[2].path == second.pretrained(30)


@pytest.mark.slow
def test_two_runs_of_the_same_name_are_told_apart_by_their_parent_folders(tmp_path: Path) -> None:
    monday = write_lerobot_run(tmp_path / "2024-06-03" / "act", [10])
    tuesday = write_lerobot_run(tmp_path / "2024-06-04" / "act", [10])
    other = write_lerobot_run(tmp_path / "diffusion", [10])

    found = discover(*(WatchedDirectory(r.output_dir) for r in (tuesday, other, monday)))
    assert [(c.label, c.run) for c in found.complete] == [
        ("2024-06-04/act/000010", "2024-06-04/act"),
        ("diffusion/000010", "diffusion"),
        ("2024-06-03/act/000010", "2024-06-03/act"),
    ]
    with pytest.raises(CheckpointError, match=rf"training run {monday.output_dir} is watched twice"):
        discover(WatchedDirectory(monday.output_dir), WatchedDirectory(monday.checkpoints_dir))


def test_torch_kind_gives_one_checkpoint_per_module_file_with_the_step_its_stem_ends_in(tmp_path: Path) -> None:
    """A checkpoint of no step came last, so that a ``final.pt`` (or ``best.pt``) was the candidate the checks
    judge, where the README promises the highest step: it comes first now."""
    folder = tmp_path / "modules"
    write_torch_checkpoints(folder, ["step_100", "final", "epoch7"])
    write_torch_checkpoints(folder, ["step_20"], suffix=".pth")
    (folder / "notes.txt").write_text("not a module")
    (folder / "last.pt").symlink_to("step_100.pt")

    found = discover(WatchedDirectory(folder, kind="torch"))
    assert [(c.label, c.step, c.path.name) for c in found.complete] == [
        ("final", None, "final.pt"),
        ("epoch7", 7, "epoch7.pt"),
        ("step_20", 20, "step_20.pth"),
        ("step_100", 100, "step_100.pt"),
    ]


@pytest.mark.slow
def test_explicit_entries_keep_their_labels_and_take_the_step_of_their_folder(run: LeRobotRun, tmp_path: Path) -> None:
    (module,) = write_torch_checkpoints(tmp_path, ["policy_300"])
    found = discover(
        ExplicitCheckpoint("final", run.pretrained(1500)),
        ExplicitCheckpoint("first", run.step_dirs[500]),  # a step folder loads from its pretrained_model
        ExplicitCheckpoint("module", module),
        ExplicitCheckpoint("baseline", run.pretrained(1000)),
    )
    assert [(c.label, c.step, c.path) for c in found.complete] == [
        ("module", 300, module),
        ("first", 500, run.pretrained(500)),
        ("baseline", 1000, run.pretrained(1000)),
        ("final", 1500, run.pretrained(1500)),
    ]
    assert all(c.run is None for c in found.complete)


# -- completeness -----------------------------------------------------------------------------------------


def files_lerobot_wrote(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.slow
def test_each_file_a_policy_loads_is_required_and_its_absence_is_the_reason(run_copy: LeRobotRun) -> None:
    folder = run_copy.pretrained(1000)
    written = files_lerobot_wrote(folder)
    state_files = [name for name in written if name.startswith("policy_") and name.endswith(".safetensors")]
    assert len(state_files) == 2, f"one normaliser state per processor in {written}"
    processors = ["policy_preprocessor.json", "policy_postprocessor.json"]
    for name in ["config.json", "model.safetensors", *processors, *state_files]:
        moved = folder.parent / f"moved-{name}"
        (folder / name).rename(moved)
        found = discover(WatchedDirectory(run_copy.output_dir))
        assert reasons(found) == {"001000": f"missing {name}"}, name
        assert labels(found.complete) == ["000500", "001500"]
        moved.rename(folder / name)


@pytest.mark.slow
def test_training_state_and_train_config_are_not_needed_to_evaluate(run_copy: LeRobotRun) -> None:
    shutil.rmtree(run_copy.step_dirs[500] / "training_state")
    (run_copy.pretrained(500) / "train_config.json").unlink()
    assert labels(discover(WatchedDirectory(run_copy.output_dir)).complete) == ["000500", "001000", "001500"]


@pytest.mark.slow
def test_a_step_folder_without_pretrained_model_is_pending(run_copy: LeRobotRun) -> None:
    (run_copy.checkpoints_dir / "002000").mkdir()
    found = discover(WatchedDirectory(run_copy.output_dir))
    assert reasons(found) == {"002000": "missing pretrained_model/"}
    assert found.pending[0].checkpoint.step == 2000


@pytest.mark.slow
def test_a_checkpoint_changed_within_settle_s_is_still_being_written(run_copy: LeRobotRun) -> None:
    watched = WatchedDirectory(run_copy.output_dir)
    fresh = discover(watched, settle_s=3600)
    assert fresh.complete == ()
    assert all(p.reason.startswith("still being written") for p in fresh.pending), fresh.pending
    assert labels(discover(watched, settle_s=0).complete) == ["000500", "001000", "001500"]

    for step in STEPS:
        age(run_copy.step_dirs[step], 120)
    assert labels(discover(watched, settle_s=60).complete) == ["000500", "001000", "001500"]
    (run_copy.pretrained(1000) / "model.safetensors").touch()
    assert list(reasons(discover(watched, settle_s=60))) == ["001000"]


@pytest.mark.slow
def test_a_copy_that_keeps_old_mtimes_is_still_being_written_while_its_folder_changes(
    run: LeRobotRun, tmp_path: Path
) -> None:
    """``shutil.copy2`` / ``cp -p`` give each file its source's mtime; the folder it adds them to is new."""
    folder = tmp_path / "policies" / "copied"
    shutil.copytree(run.pretrained(500), folder)
    age(folder, 120)
    shutil.copy2(run.pretrained(500) / "train_config.json", folder / "train_config_copy.json")
    age(folder / "train_config_copy.json", 600)  # as copied from a file written long ago
    watched = WatchedDirectory(folder.parent)
    assert list(reasons(discover(watched, settle_s=60))) == ["copied"]
    age(folder, 120)
    assert labels(discover(watched, settle_s=60).complete) == ["copied"]


@pytest.mark.slow
def test_a_weights_file_cut_short_is_pending_as_truncated(run_copy: LeRobotRun) -> None:
    weights = run_copy.pretrained(1500) / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as stream:
        stream.truncate(size - 100)
    assert reasons(discover(WatchedDirectory(run_copy.output_dir))) == {
        "001500": f"model.safetensors is truncated ({size - 100} of {size} bytes)"
    }
    with weights.open("r+b") as stream:
        stream.truncate(4)
    assert reasons(discover(WatchedDirectory(run_copy.output_dir)))["001500"].startswith("model.safetensors is")


@pytest.mark.slow
def test_a_config_that_is_not_json_is_pending_naming_the_file(run_copy: LeRobotRun) -> None:
    """Before, it counted as complete and its load failed with a bare ``JSONDecodeError`` naming no file."""
    config = run_copy.pretrained(1500) / "config.json"
    config.write_text('{"type": "act", "chunk_size": \t\n')
    age(run_copy.output_dir, 60)
    found = discover(WatchedDirectory(run_copy.output_dir))
    assert reasons(found)["001500"].startswith("config.json is not JSON (")
    assert labels(found.complete) == ["000500", "001000"]


def test_a_module_file_cut_short_or_empty_is_pending(tmp_path: Path) -> None:
    cut, empty, whole = write_torch_checkpoints(tmp_path, ["cut", "empty", "whole"])
    size = cut.stat().st_size
    with cut.open("r+b") as stream:
        stream.truncate(size // 2)
    empty.write_bytes(b"")
    found = discover(WatchedDirectory(tmp_path, kind="torch"))
    assert found.complete == (Checkpoint("whole", whole),)
    assert reasons(found) == {
        "cut": "cut.pt is truncated (its zip archive has no end record)",
        "empty": "empty.pt is empty",
    }
    assert reasons(discover(WatchedDirectory(tmp_path, kind="torch"), settle_s=3600))["whole"].startswith(
        "still being written"
    )


# -- content hash -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_content_hash_follows_the_bytes_and_names_not_the_location(run: LeRobotRun, tmp_path: Path) -> None:
    original = Checkpoint("000500", run.pretrained(500), 500)
    copied = Checkpoint("elsewhere", shutil.copytree(run.pretrained(500), tmp_path / "a" / "b"))
    assert copied.content_hash() == original.content_hash()
    assert len(original.content_hash()) == 64
    others = {Checkpoint(str(s), run.pretrained(s)).content_hash() for s in STEPS}
    assert len(others) == len(STEPS), "steps drawn from different seeds hash differently"

    (copied.path / "config.json").rename(copied.path / "config2.json")
    renamed = copied.content_hash()
    assert renamed != original.content_hash(), "a file's name is part of the content"
    (copied.path / "config2.json").rename(copied.path / "config.json")
    with (copied.path / "model.safetensors").open("r+b") as stream:
        stream.seek(-1, os.SEEK_END)
        last = stream.read(1)
        stream.seek(-1, os.SEEK_END)
        stream.write(bytes([last[0] ^ 1]))
    assert copied.content_hash() != original.content_hash(), "one bit of the weights"


def test_a_module_file_hashes_its_bytes_whatever_its_name(tmp_path: Path) -> None:
    (file,) = write_torch_checkpoints(tmp_path / "a", ["step_1"])
    (other,) = write_torch_checkpoints(tmp_path / "b", ["step_2"])
    copy = shutil.copy(file, tmp_path / "renamed.pt")
    assert Checkpoint("x", Path(copy)).content_hash() == Checkpoint("y", file).content_hash()
    assert Checkpoint("z", other).content_hash() != Checkpoint("y", file).content_hash()


def test_hashing_a_checkpoint_that_is_gone_names_it(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=rf"checkpoint 'gone' at {tmp_path / 'gone'}"):
        Checkpoint("gone", tmp_path / "gone").content_hash()


# -- errors ----------------------------------------------------------------------------------------------------


def test_a_watched_directory_that_does_not_exist_or_is_a_file_is_refused_by_path(tmp_path: Path) -> None:
    missing = tmp_path / "runs" / "nope"
    with pytest.raises(CheckpointError, match=rf"checkpoint directory {missing} does not exist"):
        discover(WatchedDirectory(missing))
    file = tmp_path / "model.pt"
    file.write_bytes(b"x")
    with pytest.raises(CheckpointError, match=rf"{file} is not a directory"):
        discover(WatchedDirectory(file, kind="torch"))


def test_a_directory_without_any_checkpoint_says_what_was_expected(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "README.md").write_text("")
    expected = (
        rf"no checkpoint in {tmp_path}: expected {tmp_path}/checkpoints/<step>/pretrained_model/ as lerobot-train "
        r"writes it, or folders holding config.json and model.safetensors"
    )
    with pytest.raises(CheckpointError, match=expected):
        discover(WatchedDirectory(tmp_path))
    with pytest.raises(CheckpointError, match=rf"no checkpoint in {tmp_path}: expected \*\.pt or \*\.pth"):
        discover(WatchedDirectory(tmp_path, kind="torch"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=rf"{tmp_path} is itself a policy folder"):
        discover(WatchedDirectory(tmp_path))


def test_a_directory_of_the_other_kinds_checkpoints_names_that_kind(tmp_path: Path) -> None:
    write_torch_checkpoints(tmp_path / "torch_run", ["step_100"])
    with pytest.raises(CheckpointError, match=r"it holds \*\.pt / \*\.pth files: .* are `kind: torch`"):
        discover(WatchedDirectory(tmp_path / "torch_run"))
    (tmp_path / "lerobot_run" / "checkpoints" / "000100" / "pretrained_model").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"it holds lerobot policy folders: .* are `kind: lerobot`"):
        discover(WatchedDirectory(tmp_path / "lerobot_run", kind="torch"))
    with pytest.raises(CheckpointError) as plain:
        discover(WatchedDirectory(tmp_path / "lerobot_run" / "checkpoints" / "000100", kind="torch"))
    assert "kind: lerobot" in str(plain.value), "a step folder is one lerobot checkpoint"


def test_an_empty_checkpoints_folder_is_refused_until_the_first_step_appears(tmp_path: Path) -> None:
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=rf"no checkpoint in {tmp_path / 'run'}"):
        discover(WatchedDirectory(tmp_path / "run"))
    (tmp_path / "run" / "checkpoints" / "000100" / "pretrained_model").mkdir(parents=True)
    assert reasons(discover(WatchedDirectory(tmp_path / "run"))) == {
        "000100": "missing config.json, model.safetensors, policy_preprocessor.json, policy_postprocessor.json"
    }


def test_explicit_entries_with_one_label_or_a_missing_path_are_refused_by_path(tmp_path: Path) -> None:
    a, b = write_torch_checkpoints(tmp_path, ["a", "b"])
    with pytest.raises(CheckpointError, match=rf"label 'best' is given twice, for {a} and {b}"):
        discover(ExplicitCheckpoint("best", a), ExplicitCheckpoint("best", b))
    with pytest.raises(CheckpointError, match=rf"label 'best' is given twice, for {a} and {a}"):
        discover(ExplicitCheckpoint("best", a), ExplicitCheckpoint("best", a))
    missing = tmp_path / "runs" / "final"
    with pytest.raises(CheckpointError, match=rf"checkpoint 'final': {missing} does not exist \(expected a folder"):
        discover(ExplicitCheckpoint("final", missing))
    with pytest.raises(CheckpointError, match=rf"label ' ' is empty .* \(the checkpoint at {a}\)"):
        discover(ExplicitCheckpoint(" ", a))


def test_a_label_that_cannot_be_a_folder_of_results_nor_a_partition_key_is_refused_naming_the_checkpoint(
    tmp_path: Path,
) -> None:
    """Results are filed in a folder per label and Dagster keys partitions by it: a watched directory's file or
    folder named ``a|b`` would crash the run's partitions, an entry ``..`` would write outside the sweep's folder."""
    (found,) = write_torch_checkpoints(tmp_path / "odd", ["step|1"])
    with pytest.raises(
        CheckpointError, match=rf"label 'step\|1' holds '\|'.* \(the checkpoint at {re.escape(str(found))}\)"
    ):
        discover(WatchedDirectory(tmp_path / "odd", kind="torch"))
    (plain,) = write_torch_checkpoints(tmp_path / "plain", ["a"])
    for label, said in (
        (",", "holds ','"),
        ("..", "no folder below"),
        ("x/../../y", "no folder below"),
        ("a...b", "'...'"),
    ):
        with pytest.raises(CheckpointError, match=re.escape(said)):
            discover(ExplicitCheckpoint(label, plain))
    assert [c.label for c in discover(ExplicitCheckpoint("run 1/step_2 (ema)", plain)).complete] == [
        "run 1/step_2 (ema)"
    ]
    (other,) = write_torch_checkpoints(tmp_path / "other", ["b"])
    with pytest.raises(CheckpointError, match="label 'act' is a folder above 'act/000100': rename one of them"):
        discover(ExplicitCheckpoint("act/000100", plain), ExplicitCheckpoint("act", other))
    assert len(discover(ExplicitCheckpoint("act/000100", plain), ExplicitCheckpoint("act-2", other)).complete) == 2


def test_an_explicit_label_that_a_watched_directory_also_gives_is_refused(tmp_path: Path) -> None:
    watched, explicit = write_torch_checkpoints(tmp_path / "modules", ["step_1"])[0], tmp_path / "step_1.pt"
    shutil.copy(watched, explicit)
    with pytest.raises(CheckpointError, match=rf"'step_1' is given twice, for {watched} and {explicit}"):
        discover(WatchedDirectory(tmp_path / "modules", kind="torch"), ExplicitCheckpoint("step_1", explicit))


def test_one_stem_saved_as_pt_and_pth_is_refused_as_one_label_twice(tmp_path: Path) -> None:
    (pt,) = write_torch_checkpoints(tmp_path, ["final"])
    (pth,) = write_torch_checkpoints(tmp_path, ["final"], suffix=".pth")
    with pytest.raises(CheckpointError, match=rf"'final' is given twice, for {pt} and {pth}"):
        discover(WatchedDirectory(tmp_path, kind="torch"))


def test_no_source_or_a_negative_settle_time_is_refused() -> None:
    with pytest.raises(CheckpointError, match="no checkpoint source"):
        discover_checkpoints([])
    with pytest.raises(CheckpointError, match="settle_s must be >= 0"):
        discover_checkpoints([ExplicitCheckpoint("x", Path("x"))], settle_s=-1)
    assert issubclass(CheckpointError, HudPipelinesError)


# -- against lerobot ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_layout_names_are_lerobots_own() -> None:
    from lerobot.utils import constants

    from hud_pipelines.agent import checkpoint_files, checkpoints

    assert checkpoints.CHECKPOINTS_DIR == constants.CHECKPOINTS_DIR
    assert checkpoints.LAST_CHECKPOINT_LINK == constants.LAST_CHECKPOINT_LINK
    assert checkpoints.PRETRAINED_MODEL_DIR == constants.PRETRAINED_MODEL_DIR
    names = (constants.POLICY_PREPROCESSOR_DEFAULT_NAME, constants.POLICY_POSTPROCESSOR_DEFAULT_NAME)
    assert tuple(f"{name}.json" for name in names) == checkpoint_files.PROCESSOR_FILES


@pytest.mark.slow
def test_a_discovered_checkpoint_loads_with_lerobot_and_acts_as_the_policy_of_its_step(run: LeRobotRun) -> None:
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    torch.manual_seed(0)
    batch = {OBS_STATE: torch.randn(3, 2), OBS_ENV_STATE: torch.randn(3, 3)}

    def actions(policy: Any, preprocessor: Any, postprocessor: Any) -> torch.Tensor:
        with torch.inference_mode():
            return postprocessor(policy.eval().predict_action_chunk(preprocessor(dict(batch))))

    found = discover(WatchedDirectory(run.output_dir)).complete
    loaded: dict[int, torch.Tensor] = {}
    for checkpoint in found:
        assert checkpoint.step is not None
        config = PreTrainedConfig.from_pretrained(checkpoint.path)
        policy = get_policy_class(config.type).from_pretrained(checkpoint.path, config=config)
        preprocessor, postprocessor = make_pre_post_processors(config, pretrained_path=str(checkpoint.path))
        loaded[checkpoint.step] = actions(policy, preprocessor, postprocessor)
        assert torch.allclose(loaded[checkpoint.step], actions(*tiny_act(seed=checkpoint.step)))
    assert sorted(loaded) == list(STEPS)
    assert not torch.allclose(loaded[500], loaded[1000])


def test_a_run_the_yaml_no_longer_lists_never_holds_the_candidate() -> None:
    from hud_pipelines.agent.checkpoints import sweep_order

    def of(run: str | None, step: int) -> Checkpoint:
        return Checkpoint(f"{run}/{step:06d}" if run else f"{step:06d}", Path("x"), step, run)

    found = [of("act3", 100), of("act2", 300), of("act", 100), of("act2", 100)]
    ordered = sorted(found, key=sweep_order(["act", "act2"]))  # act3 was dropped from the YAML
    assert [c.label for c in ordered] == ["act3/000100", "act/000100", "act2/000100", "act2/000300"]
    one = sorted([of(None, 200), of("act", 100), of("act2", 300)], key=sweep_order([]))  # down to one run
    assert one[-1].label == "000200", "the one run listed now, whatever earlier runs left"
