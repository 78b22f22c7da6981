"""vitkit.data: sources by URI, batched augmentation, few-shot subsets, shard streams (DESIGN.md "data/")."""

from vitkit.data.sources import ImageSet, SourceInfo, describe, load_split, parse_uri
from vitkit.data.stream import ShardBatches, ShardSet, TrainBatches

__all__ = ["ImageSet", "ShardBatches", "ShardSet", "SourceInfo", "TrainBatches", "describe", "load_split", "parse_uri"]
