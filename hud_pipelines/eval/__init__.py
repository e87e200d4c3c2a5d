"""The eval: instances of a pipeline run, graded, checked, reported; the steps Dagster and the CLI share.

Submodules are imported directly (``hud_pipelines.eval.runner``, ``.steps``, ``.grades`` ...): this
package's root stays empty so that importing one step does not pull the others (or torch) in.
"""
