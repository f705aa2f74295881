"""The pieces of ``python -m tools.secrets_check`` (see :mod:`tools.secrets_check`)."""
