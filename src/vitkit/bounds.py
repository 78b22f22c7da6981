"""Bounds on what any file may declare, shared by the readers of data and of models (which import nothing of
each other): a value beyond one is corrupt or hostile, refused before it sizes anything."""

MAX_CLASSES = 1 << 20  # classes at most, labels below it: past that, corrupt (ImageNet-21k has 21,843 classes)
