"""What an operator observes beyond /metrics: OpenTelemetry traces (``tracing``)."""
