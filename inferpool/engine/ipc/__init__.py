"""What the pool and its workers share: the wire vocabulary, the rings, the control channel."""
