"""Generated from grpc_predict_v2.proto by scripts/generate_proto.py; do not edit."""
