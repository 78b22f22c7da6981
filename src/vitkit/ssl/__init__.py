"""Self-supervised pre-training: masked patch prediction (Sec. 4.6, Appendix B.1.2).

The maths lives here (corruption, colour targets, loss, held-out evaluation) and imports nothing of the
training engine; the engine runs it as an objective (vitkit.train.objectives.MaskedPatchObjective).
"""

from vitkit.ssl.masked_patch import MaskedPatchPrediction, MPPConfig, corrupt

__all__ = ["MaskedPatchPrediction", "MPPConfig", "corrupt"]
