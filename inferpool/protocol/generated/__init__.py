"""Generated from grpc_predict_v2.proto, inferpool_ext.proto and model_repository.proto
by scripts/generate_proto.py; do not edit."""
