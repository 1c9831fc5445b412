"""The Open Inference Protocol (KServe V2): typed structs, datatypes and wire formats."""
