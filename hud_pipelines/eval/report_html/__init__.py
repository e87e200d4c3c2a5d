"""The HTML report: one page per eval to watch its episodes, next to ``report.md``.

``outputs/<name>/report.html`` with its script and style in ``report_files/`` beside it; it links
the traces' camera videos and trace files by relative path, so the page works opened from the file
system and from any static file server rooted at the outputs. The summary, the tables and the
episode cards are plain HTML (readable without the script); the script draws each episode's plots
as inline SVG from the JSON embedded in the page, moves their cursor with the video, and filters and
sorts the cards. No external library, no network.
"""

from hud_pipelines.eval.report_html.dataset_links import write_dataset_links
from hud_pipelines.eval.report_html.page import ASSETS_DIR, HTML_NAME, HtmlReport, html_path, write_html_report

__all__ = ["ASSETS_DIR", "HTML_NAME", "HtmlReport", "html_path", "write_dataset_links", "write_html_report"]
