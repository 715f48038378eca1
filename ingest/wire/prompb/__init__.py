"""Generated protobuf modules (see remote.proto for how to regenerate)."""
