"""The custom-endpoint names that MLflow's root ``/invocations`` route sends a body to.

Shared by the frontend (``frontends/mlflow_scoring.py``, which picks one from the
Content-Type) and the worker (``codecs/mlflow_scoring.py``, which reads the body), so that
the frontend process need not import the codecs to name them.
"""

# An MLflow pyfunc's own endpoint answers JSON (with ``params``); every other case is the
# scoring codec's.
INVOCATIONS = "invocations"
INVOCATIONS_CSV = "invocations/csv"  # "/" never comes from the REST custom-endpoint route
