"""The detectors: thermal residual, counter-rate surprise (HBM, NVLink), NCCL busbw and
stragglers, and a per-cohort HalfSpaceTrees."""
