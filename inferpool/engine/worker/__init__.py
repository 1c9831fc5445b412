"""What runs in a worker process (and in the frontend with workers=0): the template that forks
workers, the worker loop, batching, the inference path and the loaded models."""
