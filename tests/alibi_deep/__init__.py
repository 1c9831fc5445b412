"""Tests of alibi-detect and alibi with their PyTorch and TensorFlow backends, in a
per-model environment tox's ``alibi-deep`` environment packs before them."""
