"""Load harness for V2 (Open Inference Protocol) servers: inferpool, MLServer, any target.

Run ``python -m benchmarks --help``. The package owns nothing of the server: it builds a
model repository, generates and checks payloads, drives load generators and reports.
"""
