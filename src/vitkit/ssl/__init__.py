"""Self-supervised pre-training: masked patch prediction (Sec. 4.6, Appendix B.1.2)."""

from vitkit.ssl.masked_patch import MaskedPatchPrediction, MPPConfig, corrupt

__all__ = ["MaskedPatchPrediction", "MPPConfig", "corrupt"]
