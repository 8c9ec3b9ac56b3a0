"""``hf-mdm tune``: the sampler settings that win for a model and a task, as a quality / tokens-per-second Pareto
front with intervals (`tune`; the search space in `space`, tasks in `tasks`, the search in `search`, the front and
the choice in `front`, the files in `outputs`)."""

from .front import choose, pareto_front
from .run import tune
from .search import search, time_settings
from .space import expand
from .tasks import LmEvalTask, SyntheticTask

__all__ = ["LmEvalTask", "SyntheticTask", "choose", "expand", "pareto_front", "search", "time_settings", "tune"]
