"""Dream (Dream-org/Dream-v0-Base-7B, -Instruct-7B) as native transformers classes."""

from .configuration_dream import DreamConfig
from .modeling_dream import DreamBaseModel, DreamModel, DreamPreTrainedModel

__all__ = ["DreamBaseModel", "DreamConfig", "DreamModel", "DreamPreTrainedModel"]
