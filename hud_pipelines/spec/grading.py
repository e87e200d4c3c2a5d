"""How a pipeline judges its episodes and its runs: graders (an episode -> score and success) and checks.

Graders are chosen by ``kind``; the first decides an episode's score and success, the others add
columns. Checks are pass/fail thresholds on the grade table (Dagster asset checks); a blocking one
fails the run and holds the dataset back.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from hud_pipelines.spec.base import Float, StrictModel, name_field, target_field
from hud_pipelines.spec.sections import CHECK_NAME_PATTERN, spec_rule

# -- graders --------------------------------------------------------------------------------------

BUILTIN_CHECKS = ("instances_completed", "episodes_answered")
"""The checks every eval gets, whatever its YAML says (:mod:`hud_pipelines.eval.checks`): no YAML check takes
their names."""


class _Named(StrictModel):
    name: str = name_field(
        CHECK_NAME_PATTERN, "unique name among its siblings (a column or check name); default: the `kind`"
    )

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" not in data and isinstance(data.get("kind"), str):
            return {**data, "name": data["kind"]}  # pyright: ignore[reportUnknownVariableType]
        return data  # pyright: ignore[reportUnknownVariableType]


class SuccessGrader(_Named):
    """Success from the env's own signal (`info["is_success"]`, `success`, `task_success`); score 1 or 0."""

    kind: Literal["success"] = Field(default="success", description="selects this grader")
    at: Literal["any", "end"] = Field(
        default="any",
        description="`any`: the env reported success at any step of the episode (as lerobot-eval counts it; "
        "ManiSkill's `success_once`); `end`: on its last step (ManiSkill's `success_at_end`, for a task that must "
        "hold its goal). Grade both with two success graders, e.g. a second `{kind: success, name: at_end, at: end}`",
    )


class ReturnGrader(_Named):
    """Score is the episode return; success when the return reaches `threshold` (when given)."""

    kind: Literal["return"] = Field(default="return", description="selects this grader")
    threshold: Float | None = Field(
        default=None,
        description="return at or above which an episode succeeded (a sum of rewards that reaches it on paper "
        "reaches it: ten steps of 0.1 reach 1.0, whatever the float sum's last bit); omitted: the env's success "
        "signal decides",
    )


class CallableGrader(_Named):
    """A Python function by import path grades each episode."""

    kind: Literal["callable"] = Field(default="callable", description="selects this grader")
    target: str = target_field(
        "function",
        "called as `target(episode: dict)` and returning a float score, a bool success, or a dict with `score` and "
        "`success` (a float, or a dict without `success`, leaves success to the env's signal); the dict holds the "
        "outcome (`status`, `score`, `success`, `success_reported`, `total_reward`, "
        "`steps`, `terminated`, `truncated`) and the episode's key (`task`, `instance`, `slot`, `episode`, `seed`, "
        "`trace_id`)",
    )


GraderSpec = Annotated[SuccessGrader | ReturnGrader | CallableGrader, Field(discriminator="kind")]


# -- checks ---------------------------------------------------------------------------------------


class _Check(_Named):
    blocking: bool = Field(
        default=True, description="a failing blocking check fails the run and stops downstream assets"
    )


class MinSuccessRateCheck(_Check):
    """Passes when succeeded / (succeeded + failed) is at least `value`.

    Errored slots are not failures (bound them with `max_error_rate`); no graded slot at all fails the check.
    Nor do they carry a pass: where the errored slots of the run could decide the verdict (the rate
    would pass had they all succeeded and fail had they all failed), the check fails as undecided,
    with both figures, whichever side the answered slots alone fall on. Instances not run with this
    configuration yet (a run of some partitions) are no answer of the eval's and do not decide it: the
    verdict says where running them could change it.
    """

    kind: Literal["min_success_rate"] = Field(default="min_success_rate", description="selects this check")
    value: Float = Field(ge=0.0, le=1.0, description="lowest acceptable success rate, 0..1")


class MaxErrorRateCheck(_Check):
    """Passes when the share of errored slots (sim or policy faults) is at most `value`. Instances not run with
    this configuration yet (a run of some partitions) are no errors of the eval's and are left out of it."""

    kind: Literal["max_error_rate"] = Field(default="max_error_rate", description="selects this check")
    value: Float = Field(ge=0.0, le=1.0, description="highest acceptable error rate, 0..1")


class MinMeanScoreCheck(_Check):
    """Passes when the mean score of the graded (non-errored) slots is at least `value`.

    Errored slots are left out of the mean. Where the first grader's scores are bounded (a `success`
    grader's 0 or 1) and the errored slots could decide the verdict (it would pass had they all scored
    the highest and fail had they all scored the lowest), the check fails as undecided, as
    `min_success_rate` does; where they are not (a return), the verdict says how many the mean left out.
    """

    kind: Literal["min_mean_score"] = Field(default="min_mean_score", description="selects this check")
    value: Float = Field(description="lowest acceptable mean score (in the first grader's units)")


class NoRegressionCheck(_Check):
    """Fails when this eval is significantly worse than a baseline run on the same episodes.

    The rows pair up by task and seed (one episode, whatever `num_envs` placed it in) with the
    baseline's `grades.json`; McNemar's exact test on the paired successes decides. The check fails
    when the candidate is worse at `confidence` and its success rate dropped by more than `max_drop`;
    when the data cannot tell, it passes and says how many paired episodes an answer would take. It
    fails as undecided where episodes that errored on one side only would make it worse had they gone
    against this eval (failed here, succeeded in the baseline): errors are not failures, nor do they
    carry a pass.
    """

    kind: Literal["no_regression"] = Field(default="no_regression", description="selects this check")
    baseline: str = Field(
        min_length=1,
        description="the baseline's grades.json (or its outputs folder), relative to the YAML file; never this "
        "pipeline's own (each run rewrites it before its checks read it): copy a grades.json to a file of its own",
    )
    max_drop: Float = Field(default=0.05, ge=0.0, le=1.0, description="largest tolerated drop in success rate, 0..1")
    confidence: Float = Field(default=0.95, gt=0.5, lt=1.0, description="confidence of the verdict (1 - alpha)")


CheckSpec = Annotated[
    MinSuccessRateCheck | MaxErrorRateCheck | MinMeanScoreCheck | NoRegressionCheck, Field(discriminator="kind")
]


def default_graders() -> list[GraderSpec]:
    return [SuccessGrader(name="success")]


def refuse_builtin_names(names: list[str]) -> None:
    """Refuse a YAML check named as a built-in one: their verdicts would share one name on the grades."""
    for index, name in enumerate(names):
        if name in BUILTIN_CHECKS:
            raise spec_rule(
                f"{index}.name",
                f"check name {name!r} is a built-in check's (every eval runs {', '.join(BUILTIN_CHECKS)}); "
                "give this check another 'name'",
            )
