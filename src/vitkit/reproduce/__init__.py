"""`vitkit reproduce STUDY`: the paper's experiments as studies of runs, reported beside the paper's numbers.

| study       | paper                        | module         |
| ----------- | ---------------------------- | -------------- |
| data-size   | Sec. 4.3, Figures 3-4        | data_size.py   |
| compute     | Sec. 4.4, Figure 5           | compute.py     |
| posemb      | App. D.4, Table 8            | posemb.py      |
| head        | App. D.3, Figure 9           | head.py        |
| shape       | App. D.2, Figure 8           | shape.py       |
| mpp         | Sec. 4.6, App. B.1.2         | mpp.py         |
| attention   | Sec. 4.5, Figure 7 right     | attention.py   |
| speed       | App. D.5, Figure 12          | speed.py       |
| transfer    | Sec. 3.2, 4.2, Tables 2, 5   | transfer.py    |

spec.py holds what a study is made of (request, context, arms, claims), study.py runs a study (plan ->
arms -> analysis -> report), arms.py runs and measures one arm (a normal run directory: killed studies
resume, finished arms are reused), scale.py fits the arms to the time budget, verdict.py decides each
claim, paper.py quotes the paper, report.py and figures.py write it up.  A study module only defines
data and functions at import; its arms train when the study runs.
"""

from __future__ import annotations

from typing import Any

from vitkit.reproduce import attention, compute, data_size, head, mpp, posemb, shape, speed, transfer
from vitkit.reproduce.spec import Study, StudyRequest
from vitkit.reproduce.study import run_study

STUDIES: dict[str, Study] = {
    "data-size": data_size.STUDY,
    "compute": compute.STUDY,
    "posemb": posemb.STUDY,
    "head": head.STUDY,
    "shape": shape.STUDY,
    "mpp": mpp.STUDY,
    "attention": attention.STUDY,
    "speed": speed.STUDY,
    "transfer": transfer.STUDY,
}

__all__ = ["STUDIES", "Study", "StudyRequest", "get_study", "reproduce", "run_study"]


def get_study(name: str) -> Study:
    """The study called `name` (one of STUDIES)."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; choose from {', '.join(STUDIES)}")
    return STUDIES[name]


def reproduce(name: str, request: StudyRequest) -> dict[str, Any]:
    """Run (or resume) study `name`; returns its summary (claims with verdicts, report path, minutes)."""
    return run_study(get_study(name), request)
