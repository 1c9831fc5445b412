"""The R runtime (rpy2, R from apt): tox -e languages."""
