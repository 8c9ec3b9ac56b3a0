"""MkDocs hook: the committed figures the pages show, served from where they are.

The results' figures (``results/*.png``, written by ``make reproduce``) and the tuning examples' fronts
(``evaluation/tune_examples/*/front.png``) stay where their commands write them; this hook adds them to the site at
the same paths, so a page links ``results/ser_vs_steps.png`` (from ``docs/results/``: ``ser_vs_steps.png``, which is
also how ``results/REPORT.md``, included there, names them) and ``mkdocs build --strict`` checks every such link.
The Markdown tables are included as text with ``pymdownx.snippets`` (mkdocs.yml), so no number is copied.
"""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("results/*.png", "evaluation/tune_examples/*/front.png")


def on_files(files, config):
    for pattern in FIGURES:
        for path in sorted(ROOT.glob(pattern)):
            files.append(
                File(
                    path.relative_to(ROOT).as_posix(),
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files
