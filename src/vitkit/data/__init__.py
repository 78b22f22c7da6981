"""vitkit.data: sources by URI, batched augmentation, few-shot subsets (DESIGN.md "data/")."""

from vitkit.data.sources import ImageSet, SourceInfo, describe, load_split, parse_uri

__all__ = ["ImageSet", "SourceInfo", "describe", "load_split", "parse_uri"]
