"""Generated from grpc_predict_v2.proto and inferpool_ext.proto by scripts/generate_proto.py; do not edit."""
